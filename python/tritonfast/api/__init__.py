"""The server's API: the data plane both frontends call (:mod:`.dataplane`), and the handle
models and backends call (:mod:`.serverhandle`)."""
