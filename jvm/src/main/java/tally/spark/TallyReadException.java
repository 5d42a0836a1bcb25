package tally.spark;

/** A read refused or failed by a tablet server: its error class and message, one line. */
public final class TallyReadException extends RuntimeException {
  TallyReadException(String message) {
    super(message);
  }
}
