"""The whole pipeline at scale: preprocessing, train/evaluate/recommend/export/serve, model files, paropt."""
