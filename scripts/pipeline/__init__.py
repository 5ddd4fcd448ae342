"""The train-select-serve pipeline's tools: make pipeline's last step (serve_once), and the cluster's Workflow."""
