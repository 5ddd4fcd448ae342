"""The tools around the trainer, one room per job; run from the repository root as `python -m scripts.<room>.<tool>`.

common/ is what the rooms share; every other room is optional: delete the ones you do not use.
"""
