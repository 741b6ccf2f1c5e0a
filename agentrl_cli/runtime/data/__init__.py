"""The trajectory store: schema, redaction, Parquet writer, local and S3 stores, queries,
retention, evaluation metrics and replay."""
