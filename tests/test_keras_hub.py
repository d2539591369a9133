"""keras-hub task models as keras-hub's docs use them: tiny configurations, no downloads.

A task with a preprocessor is fed raw strings; its own `fit` / `evaluate` / `predict` run the
preprocessor over every batch, and so does kerastrain. A causal LM ties its token embedding
to its output (one weight, two uses), which trains as it is on one device.
"""

import keras
import numpy as np
import pytest

import keras_hub  # a test dependency (pyproject's `test` extra)

import kerastrain as kt

MIRRORED = {"name": "mirrored", "cpu_devices": 2}
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox",
              "a", "dog"]
TEXTS = np.array(["the quick brown fox", "a dog", "the dog", "quick fox"] * 4)
LABELS = np.array([0, 1, 1, 0] * 4)
FIT = dict(batch_size=4, epochs=2, shuffle=False)


def classifier():
    keras.utils.set_random_seed(0)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer=keras_hub.models.BertTokenizer(vocabulary=VOCABULARY), sequence_length=8)
    # No dropout: under several replicas each replica draws its own masks (docs), and with
    # a loss this close to ln 2 that alone moves the numbers.
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=8, dropout=0.0)
    model = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2,
                                                preprocessor=preprocessor, dropout=0.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["sparse_categorical_accuracy"])
    return model


@pytest.mark.parametrize("strategy", ["one_device", MIRRORED], ids=["one_device", "mirrored"])
def test_a_task_with_a_preprocessor_trains_on_raw_strings_as_its_own_fit(strategy):
    reference = classifier()
    expected = reference.fit(TEXTS, LABELS, verbose=0, **FIT).history
    model = classifier()
    trainer = kt.Trainer(model, strategy=strategy, verbose=0, checkpoint=False,
                         tensorboard=False)
    got = trainer.fit(TEXTS, LABELS, validation_data=(TEXTS[:8], LABELS[:8]), **FIT).history
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5)
    np.testing.assert_allclose(
        trainer.evaluate(TEXTS, LABELS, batch_size=4)["loss"],
        reference.evaluate(TEXTS, LABELS, batch_size=4, verbose=0, return_dict=True)["loss"],
        rtol=1e-5)
    np.testing.assert_allclose(trainer.predict(TEXTS[:6]),
                               reference.predict(TEXTS[:6], verbose=0), rtol=1e-5, atol=1e-6)


def test_a_causal_lm_whose_output_shares_the_token_embedding_trains_on_one_device():
    def causal_lm():
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=16, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
            max_sequence_length=6, dropout=0.0)
        model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    tokens = np.random.RandomState(0).randint(0, 16, (8, 6))
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((8, 5), bool)}
    reference, model = causal_lm(), causal_lm()
    expected = reference.fit(x, tokens[:, 1:], verbose=0, **FIT).history["loss"]
    trainer = kt.Trainer(model, strategy="one_device", verbose=0, checkpoint=False,
                         tensorboard=False)
    np.testing.assert_allclose(trainer.fit(x, tokens[:, 1:], **FIT).history["loss"], expected,
                               rtol=1e-5)
    assert len(model.weights) == len(reference.weights)
