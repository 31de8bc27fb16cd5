"""The only code that talks to MLflow (tracking, the run log), and what a job leaves on disk first (result
files); the retries that bound a store's time-outs, and the redaction every string passes before it leaves."""
