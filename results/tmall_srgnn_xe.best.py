# Best parameters of Optuna study 'tmall_srgnn_xe': trial 0, MRR@20=0.183687 on ../shared/data/tmall_srgnn/train_valid.tsv (gru4rec paropt)
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'cross-entropy'),
    ('constrained_embedding', True),
    ('n_sample', 2048),
    ('logq', 1.0),
    ('n_epochs', 5),
    ('layers', [512]),
    ('batch_size', 128),
    ('learning_rate', 0.05),
    ('dropout_p_embed', 0.5),
    ('dropout_p_hidden', 0.3),
    ('momentum', 0.15),
    ('sample_alpha', 0.3),
])
