package tally.spark;

import java.util.Map;

import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code format("tally-jvm")}: reads the parts a Python driver planned and signed
 * ({@code sink.read_table}), given with their Spark schema. It does not plan by itself: the
 * planner, its options and their checks live in Python, shared with {@code format("tally")}.
 */
public final class TallyJvmSource implements TableProvider, DataSourceRegister {
  @Override
  public String shortName() {
    return "tally-jvm";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    throw new IllegalArgumentException(
        "format('tally-jvm') reads a read planned by sink.read_table(spark, options), which "
            + "gives it the schema and the parts; call that instead");
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> options) {
    return new PartsScan(schema, new CaseInsensitiveStringMap(options));
  }
}
