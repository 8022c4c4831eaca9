# Best parameters of Optuna study 'rsc15_100k_bprmax_wide_fixed': trial 0, MRR@20=0.079428 on .gpu_data/rsc15_train_valid.tsv.gz (gru4rec paropt)
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'bpr-max'),
    ('n_sample', 128),
    ('n_epochs', 2),
    ('layers', [64]),
    ('batch_size', 64),
    ('embedding', 128),
    ('constrained_embedding', True),
    ('learning_rate', 0.27903886557029284),
    ('momentum', 0.1),
    ('dropout_p_embed', 0.15),
    ('dropout_p_hidden', 0.55),
    ('sample_alpha', 0.5),
    ('logq', 0.9),
    ('bpreg', 1.9),
    ('final_act', 'tanh'),
])
