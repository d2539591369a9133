"""How kerastrain's compiled functions are traced (shared by the step, data and ps code)."""


def unconverted(fn):
    """`fn` as a compiled loop calls it: traced as written, not rewritten by autograph.

    Only the loops themselves (`while` and `for` over tensors, `break` where the data ends)
    need autograph. What they call (the step, the input's reads, the reductions) is plain
    TensorFlow code: rewriting it gained nothing and cost about 2.2 s of CPU in every
    process that trains (68 functions rewritten at each start, 2.4 s against 0.2 s
    after; bench/startup.py). The model, the user's own `train_step` and losses run as
    under Keras's `fit`, which marks its step functions `do_not_convert` too.
    """
    import tensorflow as tf
    return tf.autograph.experimental.do_not_convert(fn)


def runs_eagerly(model) -> bool:
    """Whether `model` was compiled with `run_eagerly=True`: Keras's debugging mode, where
    every step runs as plain Python (prints of values, `pdb`, `.numpy()` in `call`)."""
    return bool(getattr(model, "run_eagerly", False))


def compiled(fn, *, eager=False, **options):
    """`tf.function(fn, **options)`, or `fn` itself where the model runs eagerly (`eager`):
    the same loop, step and reductions, run op by op as Keras's `run_eagerly` runs them.

    A loop written for autograph (`while` over tensors, `break` where the data ends) runs
    eagerly as it reads: each condition is a concrete tensor, which Python's `while` and
    `if` evaluate.
    """
    if eager:
        return fn
    import tensorflow as tf
    return tf.function(fn, **options)
