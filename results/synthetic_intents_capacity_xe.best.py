# Best parameters of Optuna study 'synthetic_intents_capacity_xe': trial 12, MRR@20=0.140276 on .bench/intents20k/train_valid.tsv (gru4rec paropt)
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'cross-entropy'),
    ('layers', [448]),
    ('constrained_embedding', False),
    ('n_epochs', 15),
    ('batch_size', 160),
    ('learning_rate', 0.04350903008885664),
    ('momentum', 0.55),
    ('dropout_p_embed', 0.45),
    ('dropout_p_hidden', 0.5),
    ('sample_alpha', 0.5),
    ('logq', 1.0),
])
