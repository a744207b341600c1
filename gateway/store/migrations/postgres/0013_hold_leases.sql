-- a hold being executed carries a lease (THREATS G20): lease_owner is
-- the gateway process sending it (its replica id and a token of its own),
-- which moves lease_expires on while it lives. Once the lease has passed,
-- another replica takes the hold over and reconciles it as a restart
-- would. Times are Unix nanoseconds of the database server's clock.
ALTER TABLE holds ADD COLUMN lease_owner TEXT NOT NULL DEFAULT '';
ALTER TABLE holds ADD COLUMN lease_expires BIGINT NOT NULL DEFAULT 0;
CREATE INDEX holds_lease ON holds (status, lease_expires);
