# The local node's make targets, included by the Makefile: a single-node Kubernetes built here from pinned modules
# (scripts/node/settings.env), and the cluster suite run on it. Deleting scripts/node/ removes them with the node;
# the template's targets (run-local, submit against k3d or your cluster) never call these.
.PHONY: cluster-up cluster-down agent-down link-rate cluster-suite-up test-cluster

cluster-up: $(if $(SERVE),install) ## a single-node Kubernetes as local processes, for a machine with no Docker engine, with the engine ENGINE (KUEUE=1: Kueue; SERVE=1: KServe and Argo Workflows; KATIB=1: Katib; NODES=2: a second node) as k3d-up has (as root; builds its parts once into NODE_CACHE; context node-CLUSTER_NAME)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) KUEUE=$(KUEUE) SERVE=$(SERVE) KATIB=$(KATIB) NODES=$(NODES) ENGINE=$(ENGINE) PY=$(PY) scripts/node/up.sh

cluster-down: ## stop the local node: no process, container, mount or state left (the built parts stay)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) scripts/node/down.sh

agent-down: ## the agent node (NODES=2) lost, as a machine that loses its power: its processes, containers and link stop; the API keeps its Node and pods (make cluster-up NODES=2 brings it back)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) scripts/node/down.sh --agent

link-rate: ## the agent node's link (NODES=2) limited to NODE_LINK_RATE each way, now, as cluster-up sets it (empty: unlimited; as root)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) scripts/node/link-rate.sh

# Requests sized for a 2-core node that also runs the engines' controllers. Every job's pods spread over the two nodes,
# on a volume both mount. Two test files at once: the suite mostly waits on controllers and pods, and each file keeps to
# its own jobs, names and namespaces.
CLUSTER_SUITE = KUBE_CONTEXT=node-$(CLUSTER_NAME) WORKER_CPU_REQUEST=200m PS_EVALUATOR_CPU_REQUEST=100m \
  DATA_CPU_REQUEST=100m SERVE_CPU_REQUEST=100m VOLUME_ACCESS_MODE=ReadWriteMany VOLUME_STORAGE_CLASS=local-path-shared \
  CLUSTER_SUITE_IMAGE=$(IMAGE) $(PY) -m pytest scripts/node/tests

# The cluster suite's cluster: both nodes, every engine, Kueue, KServe, Argo Workflows and Katib.
cluster-suite-up: install image
	$(MAKE) --no-print-directory cluster-up ENGINE=tfjob SERVE=1 NODES=2
	$(MAKE) --no-print-directory cluster-up ENGINE=trainjob KUEUE=1 KATIB=1 NODES=2

# The end-to-end suite on the local node: make submit, status, logs, fetch-model and delete against a real API server,
# kubelet and the engines' controllers (CI runs it; scripts/node/tests/). The node stays up after it: make cluster-down ends it.
# The lost-node test runs alone, after the others, whose pods run on the node it stops. NODE_LOSS=only runs it alone,
# NODE_LOSS=no the others alone. CI runs the lost-node test beside the slow suite (it mostly waits on nodes), then
# the others after the slow suite, or beside it where it has 4 CPUs or more (.ci/run).
NODE_LOSS ?= last
test-cluster: cluster-suite-up ## run the cluster suite on the local node, with every engine, Kueue and Katib (as root; scripts/node/tests/)
	$(if $(filter only,$(NODE_LOSS)),,$(CLUSTER_SUITE) -m "cluster and not node_loss" -n 2 --dist loadfile)
	$(if $(filter no,$(NODE_LOSS)),,$(CLUSTER_SUITE) -m node_loss -s)
