package tally.spark;

import java.io.IOException;
import java.io.InputStream;
import java.util.List;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads a task's parts one after another: each an Arrow IPC stream of one bucket at one
 * offset, its batches handed to Spark as they arrive, column by column (no copy: Spark reads
 * the Arrow vectors through ArrowColumnVector). The server cast them to Spark's Arrow types.
 */
final class PartReader implements PartitionReader<ColumnarBatch> {
  private final StructType schema;
  private final String table;
  private final List<PartTicket> parts;
  private final PartClient client;
  private final String token;
  private final BufferAllocator allocator = new RootAllocator();
  private int next;
  private PartTicket part;
  private ArrowStreamReader reader;
  private ColumnarBatch batch;

  PartReader(StructType schema, String table, List<PartTicket> parts, PartClient client,
      String token) {
    this.schema = schema;
    this.table = table;
    this.parts = parts;
    this.client = client;
    this.token = token;
  }

  @Override
  public boolean next() throws IOException {
    while (true) {
      if (reader == null) {
        if (next >= parts.size()) {
          return false;
        }
        open(parts.get(next++));
      }
      boolean loaded;
      try {
        loaded = reader.loadNextBatch();
      } catch (IOException e) {
        throw new IOException(where() + ": the stream was cut (" + e.getMessage() + ")", e);
      }
      if (loaded) {
        batch.setNumRows(reader.getVectorSchemaRoot().getRowCount());
        return true;
      }
      closeStream();
    }
  }

  private String where() {
    return "Reading " + table + " bucket " + part.bucket + " from " + part.url;
  }

  private void open(PartTicket ticket) throws IOException {
    part = ticket;
    InputStream body = client.fetch(ticket, token, table);
    reader = new ArrowStreamReader(body, allocator);
    VectorSchemaRoot root = reader.getVectorSchemaRoot();
    ColumnVector[] columns = new ColumnVector[schema.size()];
    int i = 0;
    for (StructField field : schema.fields()) {
      FieldVector vector = root.getVector(field.name());
      if (vector == null) {
        throw new IOException(where() + ": the stream has no column " + field.name());
      }
      columns[i++] = new ArrowColumnVector(vector);
    }
    // the stream reader loads every batch into the same vectors: one ColumnarBatch per stream
    batch = new ColumnarBatch(columns);
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  private void closeStream() throws IOException {
    if (reader != null) {
      reader.close();  // frees the vectors the batch wraps
      reader = null;
      batch = null;
    }
  }

  @Override
  public void close() throws IOException {
    closeStream();
    allocator.close();
  }
}
