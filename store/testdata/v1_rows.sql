-- Rows as a schema-version-1 turnguard left them: one session with a
-- finished turn and a turn that was running when the process stopped.
-- Times are Unix nanoseconds: 2025-01-02T03:04:05Z = 1735787045000000000.

INSERT INTO sessions (key, created_at, updated_at) VALUES
    ('telegram:42', 1735787045000000000, 1735787105000000000);

INSERT INTO turns (run_id, session_key, channel, chat_ref, state, stop_reason, started_at, updated_at, ended_at,
                   step_kind, step_name, step_seq, last_step_kind, last_step_name, last_step_seq) VALUES
    ('run-old-1', 'telegram:42', 'telegram', '42', 'finished', 'stop',
     1735787045000000000, 1735787050000000000, 1735787050000000000, NULL, NULL, NULL, 'llm', 'gpt-4o', 1),
    ('run-old-2', 'telegram:42', 'telegram', '42', 'running', '',
     1735787100000000000, 1735787105000000000, NULL, 'tool', 'web_search', 2, 'llm', 'gpt-4o', 1);

INSERT INTO messages (session_key, run_id, role, text, stop_reason, created_at) VALUES
    ('telegram:42', 'run-old-1', 'user', 'What is the capital of France?', '', 1735787045000000000),
    ('telegram:42', 'run-old-1', 'assistant', 'Paris.', 'stop', 1735787050000000000),
    ('telegram:42', 'run-old-2', 'user', 'Find me flights to Paris.', '', 1735787100000000000);
