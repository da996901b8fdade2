-- A sink's identity is two file hashes, each what `sha256sum` prints:
-- component_sha, of its .wasm file (of its manifest for a builtin sink),
-- and manifest_sha, of its manifest. Rows written before this migration
-- hold the older combined hash in component_sha and an empty manifest_sha.
ALTER TABLE sinks ADD COLUMN manifest_sha TEXT NOT NULL DEFAULT '';
ALTER TABLE sink_replicas ADD COLUMN manifest_sha TEXT NOT NULL DEFAULT '';
