package tally.spark;

import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;
import java.util.Collection;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * Fetches parts over HTTP(S): one java.net.http client per executor and TLS setting, kept
 * alive across tasks. TLS trusts the CA file given (the system roots without one) and
 * presents the certificate and PKCS#8 key given (mutual TLS), as Tally's Flight clients do;
 * a TLS read never sends its token to a plaintext endpoint.
 */
final class PartClient {
  private static final Map<String, PartClient> CLIENTS = new ConcurrentHashMap<>();
  private final HttpClient http;
  private final boolean tls;

  private PartClient(HttpClient http, boolean tls) {
    this.http = http;
    this.tls = tls;
  }

  static PartClient of(boolean tls, String ca, String cert, String key, String table) {
    String id = tls + "\n" + ca + "\n" + cert + "\n" + key;
    return CLIENTS.computeIfAbsent(id, k -> {
      HttpClient.Builder builder = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1);
      if (tls) {
        builder.sslContext(sslContext(ca, cert, key, table));
      }
      return new PartClient(builder.build(), tls);
    });
  }

  InputStream fetch(PartTicket part, String token, String table) throws IOException {
    String where = table + " bucket " + part.bucket + " from " + part.url;
    if (tls && !part.url.startsWith("https://")) {
      throw new IOException("Refused to read " + where + ": a TLS read needs an https endpoint");
    }
    HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(part.url))
        .POST(HttpRequest.BodyPublishers.ofString(part.ticket, StandardCharsets.US_ASCII));
    if (token != null) {
      request.header("authorization", "Bearer " + token);
    }
    HttpResponse<InputStream> response;
    try {
      response = http.send(request.build(), HttpResponse.BodyHandlers.ofInputStream());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("Interrupted reading " + where, e);
    } catch (IOException e) {
      throw new IOException("Reading " + where + " failed: " + e, e);
    }
    if (response.statusCode() == 200) {
      return response.body();
    }
    String text;
    try (InputStream body = response.body()) {
      text = new String(body.readAllBytes(), StandardCharsets.UTF_8);
    }
    String error = "HTTP " + response.statusCode();
    String message = text;
    try {
      JsonNode answer = new ObjectMapper().readTree(text);
      error = answer.get("error").asText();
      message = answer.get("message").asText();
    } catch (Exception notJson) {
      // the status and the body as they came
    }
    throw new TallyReadException(error + ": " + message + " (reading " + where + ")");
  }

  private static SSLContext sslContext(String ca, String cert, String key, String table) {
    try {
      CertificateFactory x509 = CertificateFactory.getInstance("X.509");
      TrustManagerFactory trust = null;
      if (ca != null) {
        KeyStore roots = KeyStore.getInstance(KeyStore.getDefaultType());
        roots.load(null, null);
        int i = 0;
        for (Certificate c : certificates(x509, ca)) {
          roots.setCertificateEntry("ca-" + i++, c);
        }
        trust = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        trust.init(roots);
      }
      KeyManagerFactory keys = null;
      if (cert != null && key != null) {
        char[] none = new char[0];
        KeyStore own = KeyStore.getInstance(KeyStore.getDefaultType());
        own.load(null, null);
        own.setKeyEntry("client", privateKey(key),
            none, certificates(x509, cert).toArray(new Certificate[0]));
        keys = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        keys.init(own, none);
      }
      SSLContext context = SSLContext.getInstance("TLS");
      context.init(keys == null ? null : keys.getKeyManagers(),
          trust == null ? null : trust.getTrustManagers(), null);
      return context;
    } catch (TallyReadException e) {
      throw e;
    } catch (Exception e) {
      throw new TallyReadException("InvalidOptionError: the TLS files of the read of " + table
          + " cannot be used: " + e);
    }
  }

  private static Collection<? extends Certificate> certificates(CertificateFactory x509,
      String path) throws Exception {
    try (InputStream in = Files.newInputStream(Path.of(path))) {
      return x509.generateCertificates(in);
    }
  }

  private static PrivateKey privateKey(String path) throws Exception {
    String pem = Files.readString(Path.of(path), StandardCharsets.US_ASCII);
    String begin = "-----BEGIN PRIVATE KEY-----";
    int start = pem.indexOf(begin);
    int end = pem.indexOf("-----END PRIVATE KEY-----");
    if (start < 0 || end < 0) {
      throw new TallyReadException("InvalidOptionError: option 'tls.key' (" + path + ") must be "
          + "a PKCS#8 PEM key (BEGIN PRIVATE KEY) for the JVM reader; convert it with "
          + "`openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.pk8`");
    }
    byte[] der = Base64.getMimeDecoder().decode(pem.substring(start + begin.length(), end));
    PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(der);
    Exception last = null;
    for (String algorithm : new String[] {"EC", "RSA", "Ed25519", "Ed448"}) {
      try {
        return KeyFactory.getInstance(algorithm).generatePrivate(spec);
      } catch (Exception e) {
        last = e;
      }
    }
    throw last;
  }
}
