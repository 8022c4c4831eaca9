# Best parameters of Optuna study 'synthetic_intents_capacity': trial 1, MRR@20=0.142152 on .bench/intents20k/train_valid.tsv (gru4rec paropt)
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'cross-entropy'),
    ('layers', [448]),
    ('constrained_embedding', False),
    ('n_epochs', 20),
    ('batch_size', 256),
    ('learning_rate', 0.029641720379506162),
    ('momentum', 0.6),
    ('dropout_p_embed', 0.5),
    ('dropout_p_hidden', 0.6),
    ('sample_alpha', 1.0),
    ('n_sample', 1024),
    ('logq', 0.75),
    ('bpreg', 0.8),
])
