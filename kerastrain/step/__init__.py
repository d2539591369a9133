"""What runs on the replicas: the model placed in the strategy's scope, the compiled inner loops
(many steps per `tf.function` call), accumulation, mixed precision."""
