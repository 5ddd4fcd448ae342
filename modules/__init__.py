"""Your project's own modules: your task, your datasets. Put `my_task.py` here and run with `--module modules.my_task`
(`TRAINER_MODULE`): the one task and the one dataset it registers are the defaults of --task and --dataset.

Importable without any setting: from the project root (`python -m trainer`, make run-local, the tests), and in the
image, which copies this folder to /opt/project/modules and puts /opt/project on PYTHONPATH. So a fork adds a file
here and edits neither trainer/ nor the Dockerfile. docs/fork.md walks through examples/regression.py placed here.
"""
