"""The rows the top-p simulations draw (the same as kb_bench's sampling modes): V logits per row,
N(0, 3^2) (the bench's rows) or LLM-like (a N(0, 2^2) background and 40 strong tokens 8-16 above
it: the bench's *_peaked modes)."""
V = 152064


def normal(rng):
    return rng.normal(0, 3, V)


def peaked(rng):
    x = rng.normal(0, 2, V)
    top = rng.choice(V, 40, replace=False)
    x[top] += rng.uniform(8, 16, 40)
    return x
