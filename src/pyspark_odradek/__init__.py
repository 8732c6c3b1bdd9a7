"""Spark's entry point for the `odradek` data source: PySpark imports every top-level `pyspark_*`
package it finds and registers its `DefaultSource` under `DefaultSource.name()`, so
`spark.read.format("odradek")` works as soon as odradek is installed."""

from odradek.spark.source import OdradekDataSource as DefaultSource

__all__ = ["DefaultSource"]
