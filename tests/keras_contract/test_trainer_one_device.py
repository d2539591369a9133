"""Keras's own trainer tests (the installed keras wheel's trainer_test.py), each model's
fit / evaluate / predict through `kerastrain.Trainer(model, strategy="one_device")`."""

import routing

STRATEGY = "one_device"
TestTrainer = routing.load_keras_tests("keras_trainer_test_one_device").TestTrainer
