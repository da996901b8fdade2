-- outboxd.enqueue takes the W3C trace context of the application's
-- transaction (https://www.w3.org/TR/trace-context/), stored as the
-- CloudEvents distributed-tracing extension (`traceparent`, `tracestate`):
--
--   SELECT outboxd.enqueue('order-42-paid', 'https://shop.example/orders',
--                          'com.example.order.paid', 'orders/42',
--                          '{"order": 42}'::jsonb,
--                          p_traceparent => '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01');
--
-- The two new parameters come last with defaults, so every call written for
-- the old signature (positional or named) means what it meant. The old
-- function is replaced, not overloaded (an overload would make a call with
-- five arguments ambiguous); whoever was granted EXECUTE on it is granted
-- EXECUTE on the new one.
--
-- A malformed traceparent is ignored, as W3C Trace Context §3.2.2.1 asks of
-- a receiver; neither value takes part in the idempotency comparison (a
-- retried transaction in a new trace enqueues the same event).

CREATE TEMP TABLE enqueue_grants ON COMMIT DROP AS
    SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS grantee
    FROM pg_proc p, aclexplode(p.proacl) a
    WHERE p.oid = 'outboxd.enqueue(text, text, text, text, jsonb, text, text)'::regprocedure
      AND a.privilege_type = 'EXECUTE';

DROP FUNCTION outboxd.enqueue(text, text, text, text, jsonb, text, text);

CREATE FUNCTION outboxd.enqueue(
    p_id              text,
    p_source          text,
    p_type            text,
    p_stream          text,
    p_data            jsonb,
    p_subject         text DEFAULT NULL,
    p_datacontenttype text DEFAULT 'application/json',
    p_traceparent     text DEFAULT NULL,
    p_tracestate      text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    existing outboxd.events%ROWTYPE;
    seq bigint;
    ext jsonb := '{}'::jsonb;
BEGIN
    IF p_id IS NULL OR p_id = '' OR p_source IS NULL OR p_source = '' OR p_type IS NULL OR p_type = ''
       OR p_stream IS NULL OR p_stream = '' THEN
        RAISE EXCEPTION 'outboxd.enqueue: id, source, type and stream are required'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO existing FROM outboxd.events WHERE id = p_id;
    IF FOUND THEN
        IF existing.source = p_source AND existing.type = p_type AND existing.stream = p_stream
           AND existing.data = convert_to(p_data::text, 'UTF8') THEN
            RETURN existing.sequence;
        END IF;
        RAISE EXCEPTION 'outboxd.enqueue: event % was already stored with different content', p_id
            USING ERRCODE = 'unique_violation';
    END IF;
    IF p_traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       AND p_traceparent !~ '^[0-9a-f]{2}-0{32}-' AND p_traceparent !~ '-0{16}-[0-9a-f]{2}$' THEN
        ext := jsonb_build_object('traceparent', p_traceparent);
        IF p_tracestate IS NOT NULL AND p_tracestate <> '' AND length(p_tracestate) <= 8192 THEN
            ext := ext || jsonb_build_object('tracestate', p_tracestate);
        END IF;
    END IF;
    INSERT INTO outboxd.streams (stream, last_sequence) VALUES (p_stream, 0) ON CONFLICT (stream) DO NOTHING;
    UPDATE outboxd.streams SET last_sequence = last_sequence + 1 WHERE stream = p_stream
        RETURNING last_sequence INTO seq;
    INSERT INTO outboxd.events (id, source, type, subject, datacontenttype, stream, sequence, data,
                                data_format, routed, extensions)
    VALUES (p_id, p_source, p_type, p_subject, p_datacontenttype, p_stream, seq,
            convert_to(p_data::text, 'UTF8'), 'json', false, ext::text);
    PERFORM pg_notify('outboxd_wake', 'route');
    RETURN seq;
END
$$;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT grantee FROM enqueue_grants LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION outboxd.enqueue(text, text, text, text, jsonb, text, text, text, text) TO %s', g.grantee);
    END LOOP;
END
$$;
