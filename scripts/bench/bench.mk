# The benches' make targets, included by the Makefile: throughput, scaling and start-up (make bench), scaling on the
# local two-node cluster (bench-cluster), the serving load (bench-serving, bench-floor) and the load generators they
# drive (bench-tools, at scripts/bench/settings.env's pins). Deleting scripts/bench/ removes them with the benches.
.PHONY: bench bench-cluster bench-serving bench-floor bench-tools

# The serving bench's tests (scripts/bench/tests/, in make test-slow) drive ghz and hey.
test-slow: bench-tools

bench: install bench-tools ## throughput, scaling, start-up against the tutorial loop, sync vs async; writes bench/ (BENCH_ARGS=, ARGS=)
	$(PY) -m scripts.bench.bench $(BENCH_ARGS) $(if $(ARGS),-- $(ARGS))

# Run on purpose, on the local cluster: make cluster-up NODES=2 first. It builds the image once and calls make submit,
# fetch-model and link-rate itself.
bench-cluster: install ## two workers on the local cluster's two nodes against one, at each link rate, beside the same runs in network namespaces; writes bench/cluster-links.json (as root; BENCH_ARGS=, ARGS=)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) $(PY) -m scripts.bench.cluster_links $(BENCH_ARGS) $(if $(ARGS),-- $(ARGS))

bench-serving: install bench-tools ## the serving bench alone: load by protocol, batching off against on (interleaved), shedding (BENCH_ARGS=)
	$(PY) -m scripts.bench.serving_load $(BENCH_ARGS)

bench-floor: install bench-tools ## the model server, batching off and on, against a bare Python gRPC server with no model (the floor), interleaved; shedding (BENCH_ARGS=)
	$(PY) -m scripts.bench.grpc_floor $(BENCH_ARGS)

bench-tools: install ## the serving bench's load generators, ghz and hey, into .venv/bin at their pins in scripts/bench/settings.env, checked (needs Go 1.24+)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) $(PY) -m scripts.bench.load_tools --install
