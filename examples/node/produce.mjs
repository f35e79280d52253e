// Produce one notification request to Herald from Node, as an upstream service in another
// language would: kafkajs for Kafka, @kafkajs/confluent-schema-registry for the Avro contract
// (the schema read from the registry, never registered from here). No Herald code.
//
//   KAFKA=127.0.0.1:9092 REGISTRY_URL=http://127.0.0.1:8081 TENANT=dev \
//     node produce.mjs <request_id> <user_id> <order_id>
//
// Prints the notification_id (the id the API would give the request: UUID v5 in Herald's
// notification namespace of "<len>:<tenant><len>:<request_id>", examples/README.md).
import { createHash } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { SchemaRegistry } from "@kafkajs/confluent-schema-registry";

const NAMESPACE = "0a8abc9a-5839-5af5-b18b-543af580e7b4";
const TOPIC = "herald.requests.normal"; // order_shipped is a normal-class type

function uuid5(namespace, name) {
  const ns = Buffer.from(namespace.replaceAll("-", ""), "hex");
  const hash = createHash("sha1").update(Buffer.concat([ns, Buffer.from(name, "utf8")])).digest();
  hash[6] = (hash[6] & 0x0f) | 0x50; // version 5
  hash[8] = (hash[8] & 0x3f) | 0x80; // RFC 4122 variant
  const hex = hash.subarray(0, 16).toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function notificationId(tenant, requestId) {
  return uuid5(NAMESPACE, `${tenant.length}:${tenant}${requestId.length}:${requestId}`);
}

async function main() {
  const [requestId, userId, orderId] = process.argv.slice(2);
  if (!requestId || !userId || !orderId) {
    console.error("usage: node produce.mjs <request_id> <user_id> <order_id>");
    process.exit(2);
  }
  const tenant = process.env.TENANT ?? "dev";
  const registry = new SchemaRegistry({ host: process.env.REGISTRY_URL });
  const schemaId = await registry.getLatestSchemaId(`${TOPIC}-value`);
  const nid = notificationId(tenant, requestId);
  const request = {
    notification_id: nid, request_id: requestId, tenant_id: tenant,
    notification_type: "order_shipped", traffic_class: "normal",
    recipients: { user_ids: [userId], segment_id: null }, template_version: null,
    params: { order_id: orderId }, channels: ["email"], locale: null, send_at: null,
    send_local_time: null, expire_at: null, accepted_at: Date.now(), source: "producer",
  };
  const kafka = new Kafka({ clientId: "node-example", brokers: [process.env.KAFKA], logLevel: logLevel.WARN });
  const producer = kafka.producer({ allowAutoTopicCreation: false });
  await producer.connect();
  try {
    const value = await registry.encode(schemaId, request);
    await producer.send({ topic: TOPIC, acks: -1, messages: [{ key: nid, value }] });
  } finally {
    await producer.disconnect();
  }
  console.log(nid);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
