"""`tinyrl sft`: supervised fine-tuning on parquet in verl's SFT formats (tinyrl.sft.data), with
the RL trainer's loop, models, learner, micro-batching, checkpoints and logs (tinyrl.sft.trainer).
Then `tinyrl train --set model.init_from=RUN_DIR` starts RL from the result (tinyrl.init_from).
"""
