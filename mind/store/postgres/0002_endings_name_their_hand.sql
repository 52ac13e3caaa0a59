
    ALTER TABLE run_endings ADD COLUMN hand TEXT NOT NULL DEFAULT '';
    CREATE INDEX run_endings_hand ON run_endings (hand, ended_at);
    