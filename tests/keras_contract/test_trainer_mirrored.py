"""Keras's own trainer tests through `kerastrain.Trainer(model, strategy="mirrored")`, over
the suite's two logical CPUs."""

import routing

STRATEGY = "mirrored"
TestTrainer = routing.load_keras_tests("keras_trainer_test_mirrored").TestTrainer
