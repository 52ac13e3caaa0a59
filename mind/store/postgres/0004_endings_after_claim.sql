
    CREATE FUNCTION mindhand_endings_after_claim(h TEXT, since DOUBLE PRECISION, claimed BIGINT)
    RETURNS SETOF run_endings LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        RETURN QUERY SELECT * FROM run_endings r WHERE r.hand = h AND r.ended_at >= since ORDER BY r.ended_at;
    END
    $$;
    