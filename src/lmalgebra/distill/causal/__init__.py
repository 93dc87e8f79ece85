"""The causal objective (cross-tokenizer distillation of causal LMs): teachers, the
log-probability store, student data, training, plan and evaluation."""
