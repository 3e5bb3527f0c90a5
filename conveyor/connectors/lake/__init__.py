"""Lakehouse tables: Apache Iceberg (pyiceberg) and Delta Lake (deltalake) sources and sinks."""
