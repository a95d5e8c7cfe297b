"""A reward that varies with the text, so even 8-token completions of the tiny model get
different scores and training really moves the weights (the fault suite compares them)."""


def varied(completion: str, example: dict) -> float:
    return (sum(map(ord, completion)) % 7) / 7
