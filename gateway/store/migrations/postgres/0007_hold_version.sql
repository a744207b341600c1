-- every change to a hold is a conditional update on its status and its
-- version (which each change increments): of any number of writers, on
-- any number of gateways, exactly one moves a hold out of a state.
ALTER TABLE holds ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
