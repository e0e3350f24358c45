// The devkit's OAuth 2.0 / OIDC identity provider, for tests only: a JWKS document and a token
// endpoint (client_credentials grant) over HTTPS, enough for Kafka's OAUTHBEARER validator on
// the broker and for librdkafka's and the Java client's OIDC login.
//
// Written in Java because the broker's own JOSE library (jose4j) and the JDK's HTTPS server are
// already here, so nothing is downloaded; the worker's Python environment has no RSA signer.
// Run as a single source file (java -cp '<kafka libs>/*' IdentityProvider.java) by oidc.py.
//
// stdin: its settings as a .properties text (keystore paths and passwords stay off the command
// line). stdout: one line, "port=<port>", once it listens; everything else goes to stderr.
// Clients: the file named by `clients` holds <client id>=<sha-256 hex of its secret>, read at
// each token request, so clients added while it runs can log in at once.

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpsConfigurator;
import com.sun.net.httpserver.HttpsServer;

import org.jose4j.json.JsonUtil;
import org.jose4j.jwk.JsonWebKey;
import org.jose4j.jwk.JsonWebKeySet;
import org.jose4j.jwk.RsaJsonWebKey;
import org.jose4j.jwk.RsaJwkGenerator;
import org.jose4j.jws.AlgorithmIdentifiers;
import org.jose4j.jws.JsonWebSignature;
import org.jose4j.jwt.JwtClaims;
import org.jose4j.jwt.NumericDate;

import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.Reader;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.MessageDigest;
import java.util.Base64;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Executors;

import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;

public class IdentityProvider {

    private final RsaJsonWebKey key;
    private final Path clients;
    private final String audience;
    private final long lifetimeSeconds;
    private String issuer;

    IdentityProvider(Properties conf) throws Exception {
        key = RsaJwkGenerator.generateJwk(2048);
        key.setKeyId("devkit-1");
        clients = Path.of(conf.getProperty("clients"));
        audience = conf.getProperty("audience");
        lifetimeSeconds = Long.parseLong(conf.getProperty("token.lifetime.s", "3600"));
    }

    public static void main(String[] args) throws Exception {
        Properties conf = new Properties();
        try (Reader in = new java.io.InputStreamReader(System.in, StandardCharsets.UTF_8)) {
            conf.load(in);
        }
        IdentityProvider idp = new IdentityProvider(conf);
        HttpsServer server = HttpsServer.create(new InetSocketAddress("127.0.0.1", 0), 32);
        server.setHttpsConfigurator(new HttpsConfigurator(sslContext(conf)));
        int port = server.getAddress().getPort();
        idp.issuer = "https://127.0.0.1:" + port;
        server.createContext("/jwks", idp::jwks);
        server.createContext("/token", idp::token);
        server.setExecutor(Executors.newFixedThreadPool(4));
        server.start();
        System.out.println("port=" + port);
        System.out.flush();
    }

    private static SSLContext sslContext(Properties conf) throws Exception {
        char[] password = conf.getProperty("keystore.password").toCharArray();
        KeyStore store = KeyStore.getInstance("PKCS12");
        try (InputStream in = new FileInputStream(conf.getProperty("keystore"))) {
            store.load(in, password);
        }
        KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        kmf.init(store, password);
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(kmf.getKeyManagers(), null, null);
        return ctx;
    }

    private void jwks(HttpExchange ex) throws IOException {
        try (ex) {
            if (!"GET".equals(ex.getRequestMethod())) {
                reply(ex, 405, Map.of("error", "invalid_request"));
                return;
            }
            String body = new JsonWebKeySet(key).toJson(JsonWebKey.OutputControlLevel.PUBLIC_ONLY);
            send(ex, 200, body);
        }
    }

    private void token(HttpExchange ex) throws IOException {
        try (ex) {
            if (!"POST".equals(ex.getRequestMethod())) {
                reply(ex, 405, Map.of("error", "invalid_request"));
                return;
            }
            Map<String, String> form = form(new String(ex.getRequestBody().readAllBytes(),
                                                       StandardCharsets.UTF_8));
            if (!"client_credentials".equals(form.get("grant_type"))) {
                reply(ex, 400, Map.of("error", "unsupported_grant_type"));
                return;
            }
            String[] client = credentials(ex, form);
            if (client == null || !known(client[0], client[1])) {
                // RFC 6749 5.2: a client that failed to authenticate gets 401 invalid_client.
                ex.getResponseHeaders().add("WWW-Authenticate", "Basic realm=\"devkit\"");
                reply(ex, 401, Map.of("error", "invalid_client"));
                return;
            }
            String scope = form.getOrDefault("scope", "kafka");
            Map<String, Object> out = new HashMap<>();
            out.put("access_token", sign(client[0], scope));
            out.put("token_type", "Bearer");
            out.put("expires_in", lifetimeSeconds);
            out.put("scope", scope);
            reply(ex, 200, out);
        } catch (Exception e) {
            System.err.println("token request failed: " + e);
            throw new IOException(e);
        }
    }

    private String sign(String subject, String scope) throws Exception {
        JwtClaims claims = new JwtClaims();
        claims.setIssuer(issuer);
        claims.setAudience(audience);
        claims.setSubject(subject);
        claims.setIssuedAtToNow();
        NumericDate exp = NumericDate.now();
        exp.addSeconds(lifetimeSeconds);
        claims.setExpirationTime(exp);
        claims.setGeneratedJwtId();
        claims.setClaim("scope", scope);
        JsonWebSignature jws = new JsonWebSignature();
        jws.setPayload(claims.toJson());
        jws.setKey(key.getPrivateKey());
        jws.setKeyIdHeaderValue(key.getKeyId());
        jws.setAlgorithmHeaderValue(AlgorithmIdentifiers.RSA_USING_SHA256);
        return jws.getCompactSerialization();
    }

    // client_secret_basic (librdkafka, the Java client) or client_secret_post.
    private static String[] credentials(HttpExchange ex, Map<String, String> form) {
        String auth = ex.getRequestHeaders().getFirst("Authorization");
        if (auth != null && auth.regionMatches(true, 0, "Basic ", 0, 6)) {
            String pair = new String(Base64.getDecoder().decode(auth.substring(6).trim()),
                                     StandardCharsets.UTF_8);
            int colon = pair.indexOf(':');
            if (colon < 0) return null;
            // RFC 6749 2.3.1: both parts are form-urlencoded before the Basic encoding.
            return new String[] {decode(pair.substring(0, colon)), decode(pair.substring(colon + 1))};
        }
        if (form.containsKey("client_id") && form.containsKey("client_secret")) {
            return new String[] {form.get("client_id"), form.get("client_secret")};
        }
        return null;
    }

    private boolean known(String id, String secret) throws Exception {
        Properties registered = new Properties();
        try (Reader in = Files.newBufferedReader(clients, StandardCharsets.UTF_8)) {
            registered.load(in);
        }
        String want = registered.getProperty(id);
        if (want == null) return false;
        byte[] got = MessageDigest.getInstance("SHA-256").digest(secret.getBytes(StandardCharsets.UTF_8));
        return MessageDigest.isEqual(HexFormat.of().parseHex(want), got);
    }

    private static Map<String, String> form(String body) {
        Map<String, String> out = new HashMap<>();
        for (String pair : body.split("&")) {
            if (pair.isEmpty()) continue;
            int eq = pair.indexOf('=');
            out.put(decode(eq < 0 ? pair : pair.substring(0, eq)),
                    eq < 0 ? "" : decode(pair.substring(eq + 1)));
        }
        return out;
    }

    private static String decode(String s) {
        return URLDecoder.decode(s, StandardCharsets.UTF_8);
    }

    private static void reply(HttpExchange ex, int status, Map<String, ?> json) throws IOException {
        send(ex, status, JsonUtil.toJson(json));
    }

    private static void send(HttpExchange ex, int status, String json) throws IOException {
        byte[] bytes = json.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().add("Content-Type", "application/json");
        ex.getResponseHeaders().add("Cache-Control", "no-store");
        ex.sendResponseHeaders(status, bytes.length);
        try (OutputStream out = ex.getResponseBody()) {
            out.write(bytes);
        }
    }
}
