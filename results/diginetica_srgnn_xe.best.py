# Best parameters of Optuna study 'diginetica_srgnn_xe': trial 4, MRR@20=0.176560 on ../shared/data/diginetica_srgnn/train_valid.tsv (gru4rec paropt)
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'cross-entropy'),
    ('constrained_embedding', True),
    ('n_sample', 2048),
    ('logq', 1.0),
    ('n_epochs', 4),
    ('layers', [128]),
    ('batch_size', 64),
    ('learning_rate', 0.08),
    ('dropout_p_embed', 0.25),
    ('dropout_p_hidden', 0.3),
    ('momentum', 0.25),
    ('sample_alpha', 0.6),
])
