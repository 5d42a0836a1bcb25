package tally.spark;

import java.util.List;

import org.apache.spark.sql.connector.read.InputPartition;

/** The parts one Spark task reads, one after another (each a bucket at its own offset). */
final class TicketRun implements InputPartition {
  final List<PartTicket> parts;

  TicketRun(List<PartTicket> parts) {
    this.parts = List.copyOf(parts);
  }
}
