# Best parameters of Optuna study 'diginetica_srgnn_bprmax': trial 0, MRR@20=0.180154 on ../shared/data/diginetica_srgnn/train_valid.tsv (gru4rec paropt)
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'bpr-max'),
    ('constrained_embedding', True),
    ('n_sample', 2048),
    ('logq', 0.0),
    ('n_epochs', 4),
    ('layers', [512]),
    ('batch_size', 128),
    ('learning_rate', 0.05),
    ('dropout_p_embed', 0.5),
    ('dropout_p_hidden', 0.3),
    ('momentum', 0.15),
    ('sample_alpha', 0.3),
    ('bpreg', 0.9),
    ('final_act', 'elu-1'),
])
