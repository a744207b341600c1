-- "always allow" grants that run out: max_uses is how many calls the
-- grant lets through (0: no limit, only its validity window), uses how
-- many it has. A use is taken by one conditional UPDATE (uses < max_uses),
-- so of concurrent calls exactly max_uses get one.
ALTER TABLE grants ADD COLUMN max_uses INTEGER NOT NULL DEFAULT 0;
ALTER TABLE grants ADD COLUMN uses INTEGER NOT NULL DEFAULT 0;
