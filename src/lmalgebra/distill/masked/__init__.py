"""The masked objective (MergeDistill): masking, the top-k teacher store, the union-vocabulary
student, seeding, training, plan and evaluation."""
