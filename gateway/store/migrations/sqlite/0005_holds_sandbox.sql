-- the sandbox a hold was asked from: holds are deduplicated only
-- within one sandbox (never answered with another sandbox's hold), and
-- each sandbox has its own cap on pending holds under its agent's
-- (THREATS B9). Holds stored before have sandbox ''.
ALTER TABLE holds ADD COLUMN sandbox TEXT NOT NULL DEFAULT '';
DROP INDEX holds_same;
CREATE INDEX holds_same ON holds (agent, sandbox, session, user, tool, sha256, status);
CREATE INDEX holds_sandbox ON holds (agent, sandbox, status);
