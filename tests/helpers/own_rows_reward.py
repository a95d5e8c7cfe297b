"""A user's reward over rows of their own shape (reward_model.ground_truth = {"mine": int}),
which no task's reward can read: eval's --reward judges by it."""


def parity(completion: str, example: dict) -> float:
    return 1.0 if (len(completion) + example["reward_model"]["ground_truth"]["mine"]) % 2 == 0 else 0.0
