"""Parameter servers only, the data side: training data the workers read from pipelines of
their own, with exact visits where the data allows them (`workers`)."""
