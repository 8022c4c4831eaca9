"""Published best GRU4Rec hyperparameters for coveo (docs/behaviour.md §7): bpr-max, shared embedding, 512 units.

Read by gru4rec.config without being executed; the same values are in coveo_bprmax_shared_512_best.json."""
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'bpr-max'),
    ('final_act', 'elu-1'),
    ('constrained_embedding', True),
    ('embedding', 0),
    ('layers', [512]),
    ('n_epochs', 10),
    ('batch_size', 144),
    ('dropout_p_embed', 0.35),
    ('dropout_p_hidden', 0.0),
    ('learning_rate', 0.05),
    ('momentum', 0.4),
    ('n_sample', 2048),
    ('sample_alpha', 0.2),
    ('bpreg', 1.85),
    ('logq', 0.0),
    ('adapt', 'adagrad'),
])
