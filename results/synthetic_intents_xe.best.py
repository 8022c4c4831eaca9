# Best parameters of Optuna study 'synthetic_intents_xe': trial 3, MRR@20=0.125484 on /work/exp/int/data20k/train_valid.tsv (gru4rec paropt)
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'cross-entropy'),
    ('constrained_embedding', True),
    ('n_sample', 2048),
    ('logq', 1.0),
    ('n_epochs', 10),
    ('layers', [128]),
    ('batch_size', 32),
    ('learning_rate', 0.035),
    ('dropout_p_embed', 0.25),
    ('dropout_p_hidden', 0.4),
    ('momentum', 0.55),
    ('sample_alpha', 0.2),
])
