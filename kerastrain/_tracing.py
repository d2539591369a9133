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
