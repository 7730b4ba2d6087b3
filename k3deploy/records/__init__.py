"""The records layer: the run, bisect and tune records, history and regression verdicts, reports and charts, alerts."""
