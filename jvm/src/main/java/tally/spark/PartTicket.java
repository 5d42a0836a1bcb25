package tally.spark;

import java.io.Serializable;

/** One planned part: its tablet server's endpoint, the ticket it signed, the bucket's name. */
final class PartTicket implements Serializable {
  final String url;
  final String ticket;
  final String bucket;

  PartTicket(String url, String ticket, String bucket) {
    this.url = url;
    this.ticket = ticket;
    this.bucket = bucket;
  }
}
