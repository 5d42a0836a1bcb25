package tally.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** Sent to the executors: what every task needs to fetch its parts. */
final class PartReaderFactory implements PartitionReaderFactory {
  private final StructType schema;
  private final String table;
  private final String token;
  private final boolean tls;
  private final String ca;
  private final String cert;
  private final String key;

  PartReaderFactory(StructType schema, String table, String token, boolean tls, String ca,
      String cert, String key) {
    this.schema = schema;
    this.table = table;
    this.token = token;
    this.tls = tls;
    this.ca = ca;
    this.cert = cert;
    this.key = key;
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return true;
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    throw new UnsupportedOperationException("the Tally JVM reader reads columnar batches only");
  }

  @Override
  public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
    PartClient client = PartClient.of(tls, ca, cert, key, table);
    return new PartReader(schema, table, ((TicketRun) partition).parts, client, token);
  }
}
