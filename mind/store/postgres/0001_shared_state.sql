
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE credentials (
        role TEXT NOT NULL CHECK (role IN ('hand', 'client')),
        label TEXT NOT NULL,
        secret BYTEA NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION,
        generation BIGINT NOT NULL DEFAULT 0,
        last_seen_at DOUBLE PRECISION,
        scope TEXT,
        labels TEXT,
        PRIMARY KEY (role, label)
    );
    CREATE TABLE task_snapshots (
        task_id TEXT PRIMARY KEY,
        hand TEXT NOT NULL,
        tool TEXT NOT NULL,
        args_digest TEXT NOT NULL,
        binding_digest TEXT NOT NULL,
        state TEXT NOT NULL,
        stale INTEGER NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        last_synced_at DOUBLE PRECISION,
        version BIGINT NOT NULL DEFAULT 0,
        info BYTEA,
        cancel_pending TEXT,
        start_pending INTEGER NOT NULL DEFAULT 0,
        reason TEXT NOT NULL DEFAULT '',
        owner TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX task_snapshots_hand ON task_snapshots (hand, state);
    CREATE INDEX task_snapshots_newest ON task_snapshots (created_at DESC, task_id);
    CREATE TABLE run_endings (
        run_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        ended_at DOUBLE PRECISION NOT NULL,
        cancel_reason TEXT,
        args_digest TEXT NOT NULL DEFAULT '',
        run_end BYTEA NOT NULL
    );
    CREATE INDEX run_endings_age ON run_endings (ended_at);
    CREATE TABLE run_history (
        run_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        hand TEXT NOT NULL,
        ended_at DOUBLE PRECISION NOT NULL,
        info BYTEA NOT NULL
    );
    CREATE INDEX run_history_age ON run_history (ended_at);
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        running BOOLEAN NOT NULL,
        live_runs INTEGER NOT NULL,
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE TABLE hands (
        label TEXT PRIMARY KEY,
        node TEXT,
        claim BIGINT NOT NULL DEFAULT 0,
        claimed_at TIMESTAMPTZ
    );
    