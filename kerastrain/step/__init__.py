"""The compiled inner loops: many steps per `tf.function` call, accumulation, mixed precision."""
