package tally.spark;

import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The planned read as Spark's table, scan builder, scan and batch: its parts are fixed. */
final class PartsScan implements SupportsRead, ScanBuilder, Scan, Batch {
  private final StructType schema;
  private final CaseInsensitiveStringMap options;
  private final String table;

  PartsScan(StructType schema, CaseInsensitiveStringMap options) {
    this.schema = schema;
    this.options = options;
    this.table = options.getOrDefault("table", "a Tally table");
  }

  @Override
  public String name() {
    return table;
  }

  @Override
  public StructType schema() {
    return schema;
  }

  @Override
  public Set<TableCapability> capabilities() {
    return EnumSet.of(TableCapability.BATCH_READ);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap ignored) {
    return this;
  }

  @Override
  public Scan build() {
    return this;
  }

  @Override
  public StructType readSchema() {
    return schema;
  }

  @Override
  public String description() {
    return "Tally " + table;  // never the options: they hold the token
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public InputPartition[] planInputPartitions() {
    String given = options.get("parts");
    if (given == null) {
      throw new IllegalArgumentException(
          "format('tally-jvm') needs the option 'parts': read with sink.read_table(spark, options)");
    }
    try {
      JsonNode partitions = new ObjectMapper().readTree(given);
      List<InputPartition> out = new ArrayList<>();
      for (JsonNode partition : partitions) {
        List<PartTicket> tickets = new ArrayList<>();
        for (JsonNode part : partition) {
          tickets.add(new PartTicket(part.get("url").asText(), part.get("ticket").asText(),
              part.get("bucket").asText()));
        }
        out.add(new TicketRun(tickets));
      }
      return out.toArray(new InputPartition[0]);
    } catch (Exception e) {
      throw new IllegalArgumentException(
          "format('tally-jvm'): option 'parts' of " + table + " is not the planner's JSON: " + e);
    }
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    boolean tls = Boolean.parseBoolean(options.getOrDefault("tls", "false"));
    return new PartReaderFactory(schema, table, options.get("token"), tls,
        options.get("tls.ca"), options.get("tls.cert"), options.get("tls.key"));
  }
}
