"""GRU4Rec on the synthetic intents benchmark (gru4rec synth DIR --kind intents, the defaults:
20,000 sessions, 3,000 items; docs/results.md): cross-entropy, shared embedding, 128 units.

Chosen by an Optuna study (gru4rec paropt, paramspaces/gru4rec_xe_shared_parspace.json,
objective MRR@20 on train_valid after training on train_tr, conservative ties, trials of 10
epochs): trial 3, the best of 4 finished trials (2026-12-03), validation MRR@20 0.1255 (the
enqueued rsc15 configuration: 0.1120). On test: Recall@20 0.3659 / MRR@20 0.1234, 68 % / 66 %
of the Bayes-optimal predictor's 0.5411 / 0.1884. Study: results/synthetic_intents_xe.trials.json.

Read by gru4rec.config without being executed."""
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'cross-entropy'),
    ('final_act', 'softmax'),
    ('constrained_embedding', True),
    ('embedding', 0),
    ('layers', [128]),
    ('n_epochs', 10),
    ('batch_size', 32),
    ('dropout_p_embed', 0.25),
    ('dropout_p_hidden', 0.4),
    ('learning_rate', 0.035),
    ('momentum', 0.55),
    ('n_sample', 2048),
    ('sample_alpha', 0.2),
    ('logq', 1.0),
    ('adapt', 'adagrad'),
])
