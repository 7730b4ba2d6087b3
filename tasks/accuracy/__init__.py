"""The accuracy stage: lm_eval and AISBench against the served endpoint, scores with sample accounting."""
