/*
 * HyperTF's bounds inside ZooKeeper (docs/zookeeper-layout.md, "Bounds"): ZooKeeper's own
 * digest scheme, with three checks on every create and write it authorises.
 *
 * ZooKeeper bounds a znode's name by nothing but jute.maxbuffer, and checks a quota against
 * the committed tree, not the requests in flight: one user's long names, or one multi of
 * many creates, made it hold far more than the quota said. This provider takes the
 * "digest" scheme's place (zookeeper.authProvider.hypertf=this class), so no client and no
 * ACL changes, and refuses with NoAuth, before anything is written:
 *   1. a create whose last name is longer than hypertf.zookeeper.nameMax characters (255);
 *   2. under a folder with a count or byte hard quota, by an identity that does not
 *      administer the parent: a create or write that the quota would refuse once the
 *      requests already accepted but not yet committed are counted (ZooKeeper's own check
 *      counts only what is committed), and a new child whose ACL lets anyone but the
 *      parent's administrators create below it or change its ACL (such folders stay flat).
 *   3. a read by a client that already has hypertf.zookeeper.queuedMax bytes (32 MiB) of
 *      responses queued and unsent, or 256 KiB while all clients' queues together hold a
 *      quarter of the heap (hypertf.zookeeper.queuedTotalMax): ZooKeeper queues responses
 *      without limit, so one client that sends reads and never reads the answers made it
 *      run out of heap. Such a client gets NoAuth for its reads until it reads; one 32 MiB
 *      behind (1 MiB under that pressure) is disconnected, which drops what is queued for
 *      it (its session lives on, and it may connect again).
 * So a user's count quota holds exactly and his byte quota by at most one request's data.
 */
package org.apache.zookeeper.server;

import java.lang.reflect.Field;
import java.nio.ByteBuffer;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Queue;
import java.util.WeakHashMap;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.Quotas;
import org.apache.zookeeper.StatsTrack;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.data.ACL;
import org.apache.zookeeper.server.auth.DigestAuthenticationProvider;
import org.apache.zookeeper.server.auth.ServerAuthenticationProvider;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

public final class BoundedDigestProvider extends ServerAuthenticationProvider {

    private static final Logger LOG = LoggerFactory.getLogger(BoundedDigestProvider.class);

    public static final String NAME_MAX_PROPERTY = "hypertf.zookeeper.nameMax";

    private static final int NAME_MAX = Integer.getInteger(NAME_MAX_PROPERTY, 255);

    private static final int SET_ACL = ZooDefs.Perms.CREATE | ZooDefs.Perms.ADMIN;

    private static final long QUEUED_MAX = Long.getLong("hypertf.zookeeper.queuedMax", 32L << 20);

    private static final long QUEUED_SMALL = 256L << 10;

    private static final long QUEUED_PRESSED = 1L << 20;

    private static final long QUEUED_TOTAL_MAX = Long.getLong(
        "hypertf.zookeeper.queuedTotalMax", Runtime.getRuntime().maxMemory() / 4);

    private static final long TOTAL_EVERY_NS = 100_000_000L;

    private static final long SEEN_EVERY_NS = 20_000_000L;

    private static final Field OUTGOING = outgoingField();

    /** Each connection's queue as last counted, and when: a reader of 25,000 records at
     *  once must not have its whole queue walked for every one of them. */
    private final Map<ServerCnxn, long[]> seen = Collections.synchronizedMap(new WeakHashMap<>());

    private volatile long queuedTotal;

    private volatile long queuedTotalAt = System.nanoTime() - TOTAL_EVERY_NS;

    private final DigestAuthenticationProvider digest = new DigestAuthenticationProvider();

    private long refused;

    @Override
    public String getScheme() {
        return digest.getScheme();
    }

    @Override
    public KeeperException.Code handleAuthentication(ServerObjs objs, byte[] authData) {
        return digest.handleAuthentication(objs.getCnxn(), authData);
    }

    @Override
    public boolean isAuthenticated() {
        return digest.isAuthenticated();
    }

    @Override
    public boolean isValid(String id) {
        return digest.isValid(id);
    }

    @Override
    public String getUserName(String id) {
        return digest.getUserName(id);
    }

    @Override
    public boolean matches(ServerObjs objs, MatchValues values) {
        if (!digest.matches(values.getId(), values.getAclExpr())) {
            return false;
        }
        int perm = values.getPerm();
        String why;
        if (perm == ZooDefs.Perms.READ) {
            why = backlog(objs);
        } else if (perm == ZooDefs.Perms.CREATE || perm == ZooDefs.Perms.WRITE) {
            why = refusal(objs.getZks(), values);
        } else {
            return true;
        }
        if (why == null) {
            return true;
        }
        if (refused++ % 1000 == 0) {  // a flood: one line per thousand refusals
            LOG.warn("refused {} on {} by digest:{}: {} ({} refused)",
                     perm == ZooDefs.Perms.CREATE ? "a create"
                         : perm == ZooDefs.Perms.WRITE ? "a write" : "a read",
                     abbreviated(values.getPath()), values.getId(), why, refused);
        }
        return false;
    }

    /** Why this create or write may not be done, or null. Runs on the one thread that
     *  prepares requests, so what it counts cannot change under it but by commits. */
    private static String refusal(ZooKeeperServer zks, MatchValues values) {
        String path = values.getPath();
        boolean create = values.getPerm() == ZooDefs.Perms.CREATE;
        if (create && path.length() - path.lastIndexOf('/') - 1 > NAME_MAX) {
            return "a name longer than " + NAME_MAX + " characters";
        }
        DataTree tree = zks.getZKDatabase().getDataTree();
        String prefix = tree.getMaxPrefixWithQuota(path);
        if (prefix == null || prefix.isEmpty()) {
            return null;
        }
        StatsTrack limits = track(tree, Quotas.limitPath(prefix));
        long countMax = limits == null ? -1 : bound(limits.getCount(), limits.getCountHardLimit());
        long bytesMax = limits == null ? -1 : bound(limits.getBytes(), limits.getByteHardLimit());
        if (countMax < 0 && bytesMax < 0) {
            return null;
        }
        if (!createsIn(aclOf(zks, tree, prefix), values.getId())) {
            return null;  // not one of the folder's users: its admin, the keeper, a reader
        }
        String parent = create ? path.substring(0, Math.max(path.lastIndexOf('/'), 1)) : path;
        List<ACL> parentAcl = aclOf(zks, tree, parent);
        if (create && values.getSetAcls() != null) {
            for (ACL acl : values.getSetAcls()) {
                if ((acl.getPerms() & SET_ACL) != 0
                    && !("digest".equals(acl.getId().getScheme())
                         && administers(parentAcl, acl.getId().getId()))) {
                    return "a child whose ACL lets " + acl.getId() + " create below it";
                }
            }
        }
        long[] held = held(zks, tree, prefix);  // {znodes, bytes}, requests in flight included
        if (held == null) {
            return null;
        }
        long count = held[0] + (create ? 1 : 0);
        if (countMax >= 0 && count > countMax) {
            return "past the count quota of " + prefix + " (" + countMax
                + ") with the requests in flight";
        }
        if (bytesMax >= 0 && held[1] > bytesMax) {
            return "past the byte quota of " + prefix + " (" + bytesMax
                + ") with the requests in flight";
        }
        return null;
    }

    /** What prefix's subtree holds once the accepted, uncommitted requests are counted:
     *  znodes and data bytes (the committed stats, then each path's latest change against
     *  what the tree holds), read under the lock that commits take; null: no stats. */
    private static long[] held(ZooKeeperServer zks, DataTree tree, String prefix) {
        String below = prefix + "/";
        synchronized (zks.outstandingChanges) {
            StatsTrack stats = track(tree, Quotas.statPath(prefix));
            if (stats == null) {
                return null;
            }
            long znodes = stats.getCount();
            long bytes = stats.getBytes();
            for (Map.Entry<String, ZooKeeperServer.ChangeRecord> entry
                     : zks.outstandingChangesForPath.entrySet()) {
                String path = entry.getKey();
                if (!path.startsWith(below)) {
                    continue;
                }
                ZooKeeperServer.ChangeRecord change = entry.getValue();
                DataNode node = tree.getNode(path);
                boolean willBe = change.stat != null;
                znodes += (willBe ? 1 : 0) - (node != null ? 1 : 0);
                bytes += (willBe && change.data != null ? change.data.length : 0) - length(node);
            }
            return new long[] {znodes, bytes};
        }
    }

    private static long length(DataNode node) {
        if (node == null) {
            return 0;
        }
        synchronized (node) {
            byte[] data = node.getData();
            return data == null ? 0 : data.length;
        }
    }

    private static List<ACL> aclOf(ZooKeeperServer zks, DataTree tree, String path) {
        synchronized (zks.outstandingChanges) {
            ZooKeeperServer.ChangeRecord change = zks.outstandingChangesForPath.get(path);
            if (change != null && change.acl != null) {
                return change.acl;
            }
        }
        DataNode node = tree.getNode(path);
        return node == null ? List.of() : zks.getZKDatabase().aclForNode(node);
    }

    /** Why this connection may not be sent one more response now, or null. */
    private String backlog(ServerObjs objs) {
        long own = queuedNow(objs.getCnxn());
        if (own < QUEUED_SMALL) {
            return null;
        }
        if (own >= QUEUED_MAX) {
            // Hopelessly behind: closing drops what is queued (its session lives on, and the
            // client may connect again); refusing alone would queue the refusals.
            objs.getCnxn().close(ServerCnxn.DisconnectReason.CONNECTION_CLOSE_FORCED);
            return own + " bytes of responses unread by the client: connection closed";
        }
        long now = System.nanoTime();
        if (now - queuedTotalAt >= TOTAL_EVERY_NS) {
            long total = 0;
            for (ServerCnxnFactory factory : new ServerCnxnFactory[] {
                     objs.getZks().getServerCnxnFactory(),
                     objs.getZks().getSecureServerCnxnFactory()}) {
                if (factory != null) {
                    for (ServerCnxn cnxn : factory.getConnections()) {
                        total += queued(cnxn);
                    }
                }
            }
            queuedTotal = total;
            queuedTotalAt = now;
        }
        if (queuedTotal >= QUEUED_TOTAL_MAX) {
            if (own >= QUEUED_PRESSED) {
                objs.getCnxn().close(ServerCnxn.DisconnectReason.CONNECTION_CLOSE_FORCED);
            }
            return own + " bytes unread by the client while all clients' hold " + queuedTotal;
        }
        return null;
    }

    /** ``queued``, counted at most every 20 ms per connection. */
    private long queuedNow(ServerCnxn cnxn) {
        long now = System.nanoTime();
        long[] last = seen.get(cnxn);
        if (last != null && now - last[1] < SEEN_EVERY_NS) {
            return last[0];
        }
        long bytes = queued(cnxn);
        seen.put(cnxn, new long[] {bytes, now});
        return bytes;
    }

    /** The bytes queued for this connection and not yet sent, counted up to QUEUED_MAX
     *  (NIO's queue; 0 for others: the Netty factory, used with TLS, keeps its own). */
    private static long queued(ServerCnxn cnxn) {
        if (OUTGOING == null || !(cnxn instanceof NIOServerCnxn)) {
            return 0;
        }
        try {
            long bytes = 0;
            for (Object buffer : (Queue<?>) OUTGOING.get(cnxn)) {
                bytes += ((ByteBuffer) buffer).remaining();
                if (bytes >= QUEUED_MAX) {
                    break;
                }
            }
            return bytes;
        } catch (IllegalAccessException | RuntimeException err) {
            return 0;
        }
    }

    private static Field outgoingField() {
        try {
            Field field = NIOServerCnxn.class.getDeclaredField("outgoingBuffers");
            field.setAccessible(true);
            return field;
        } catch (ReflectiveOperationException | RuntimeException err) {
            LOG.warn("this ZooKeeper's NIOServerCnxn has no outgoingBuffers: responses a client "
                     + "leaves unread are not bounded", err);
            return null;
        }
    }

    /** The folder's users' bound: its soft limit where one is set (the hard one leaves
     *  the keeper room for its own writes in their records), else the hard one. */
    private static long bound(long soft, long hard) {
        return soft >= 0 ? soft : hard;
    }

    /** Whether digestId may create in the folder without administering it: a user of it. */
    private static boolean createsIn(List<ACL> acls, String digestId) {
        boolean creates = false;
        for (ACL acl : acls) {
            if ("digest".equals(acl.getId().getScheme()) && acl.getId().getId().equals(digestId)) {
                if ((acl.getPerms() & ZooDefs.Perms.ADMIN) != 0) {
                    return false;
                }
                creates |= (acl.getPerms() & ZooDefs.Perms.CREATE) != 0;
            }
        }
        return creates;
    }

    private static boolean administers(List<ACL> acls, String digestId) {
        for (ACL acl : acls) {
            if ((acl.getPerms() & ZooDefs.Perms.ADMIN) != 0
                && "digest".equals(acl.getId().getScheme())
                && acl.getId().getId().equals(digestId)) {
                return true;
            }
        }
        return false;
    }

    private static StatsTrack track(DataTree tree, String path) {
        DataNode node = tree.getNode(path);
        if (node == null) {
            return null;
        }
        synchronized (node) {
            return node.getData() == null ? null : new StatsTrack(node.getData());
        }
    }

    private static String abbreviated(String path) {
        return path.length() <= 200 ? path : path.substring(0, 200) + "... ("
            + path.length() + " characters)";
    }
}
