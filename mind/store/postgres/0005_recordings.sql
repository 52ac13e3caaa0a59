    CREATE TABLE recordings (
        run_id TEXT PRIMARY KEY,
        hand TEXT NOT NULL,
        client TEXT NOT NULL,
        tool TEXT NOT NULL,
        kind TEXT NOT NULL,
        command TEXT NOT NULL,
        started DOUBLE PRECISION NOT NULL,
        node TEXT NOT NULL DEFAULT '',
        ended DOUBLE PRECISION,
        state TEXT,
        exit_code INTEGER,
        bytes BIGINT NOT NULL DEFAULT 0,
        blocks INTEGER NOT NULL DEFAULT 0,
        gaps INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX recordings_started ON recordings (started);
    CREATE TABLE recording_blocks (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        t BIGINT NOT NULL,
        data BYTEA NOT NULL,
        compressed BOOLEAN NOT NULL,
        head BYTEA NOT NULL,
        mac BYTEA NOT NULL,
        raw_len INTEGER NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
