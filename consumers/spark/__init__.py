"""Spark Structured Streaming CN jobs: a Kafka source over confluent-kafka (PySpark's
Python Data Source API), and the built-in `format("kafka")` where its jars are present.

Import `consumers.spark.source` for `register`, `kafka_stream` and `KwalKafkaDataSource`.
"""
