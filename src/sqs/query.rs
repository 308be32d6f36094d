//! The SQS query protocol (form-encoded `Action=…` requests, XML replies; botocore ≤ 1.34.89, Java SDK v1 ≤
//! 1.12.583) translated to and from the JSON 1.0 protocol's shapes, the only ones the SQS handlers see. Pure
//! functions over one hand-written table of the 2012-11-05 query model (`ACTIONS`); the SQS HTTP front calls them for
//! query requests. Wire rules: `docs/sqs-protocol-notes.md` §3.

use serde_json::{Map, Number, Value};
use std::collections::BTreeMap;
use std::fmt;

/// Largest index accepted in an indexed form key (`SendMessageBatchRequestEntry.N.…`, `Tag.N.Key`). Default 1000:
/// no SQS list or map holds more than 50 entries, and a larger `N` is refused before anything is collected.
pub const MAX_FORM_INDEX: u32 = 1000;

/// The query API's XML namespace, on every reply's root element.
const XMLNS: &str = "http://queue.amazonaws.com/doc/2012-11-05/";

/// Longest piece of client input quoted back in a [`QueryError`] message.
const MAX_QUOTED_CHARS: usize = 64;

/// A malformed query-protocol form: an index that is not `1..=MAX_FORM_INDEX`, an integer that is not one, a
/// parameter given twice, a map entry without its key or value, an unknown action. The caller answers `400` with a
/// modelled code (`InvalidParameterValue`, or `InvalidAction` for an unknown action). Missing required members are
/// not checked here: the handlers check them for both protocols.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryError {
    /// For the client, in the reply's `<Message>`.
    pub message: String,
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for QueryError {}

/// Form pairs of a query-protocol request (already percent-decoded, in order) -> the JSON protocol's input shape for
/// `action`. Pairs that are no member of the action's input (`Action`, `Version`, SigV2 leftovers, members of later
/// models) are ignored, as the JSON protocol ignores unknown members.
pub fn input_from_form(action: &str, pairs: &[(String, String)]) -> Result<Value, QueryError> {
    let Some(spec) = find_action(action) else {
        return Err(QueryError {
            message: format!(
                "The action {} is not valid for this endpoint.",
                quote(action)
            ),
        });
    };
    let pairs: Vec<Pair> = pairs
        .iter()
        .map(|(k, v)| Pair {
            key: Some(k),
            value: v,
        })
        .collect();
    Ok(Value::Object(parse_members(spec.input, &pairs, "")?))
}

/// The JSON protocol's output shape for `action` -> the query protocol's XML reply body:
/// `<{Action}Response xmlns=…><{Action}Result>…</{Action}Result><ResponseMetadata><RequestId>…`. Actions without
/// output (DeleteMessage, PurgeQueue, …) get only `ResponseMetadata`. Members the table does not know, `null`s and
/// values of the wrong JSON type are left out; nothing here panics.
pub fn output_to_xml(action: &str, output: &Value, request_id: &str) -> String {
    let spec = find_action(action);
    let name: String = match spec {
        Some(spec) => spec.name.to_owned(),
        // Only the table's names are trusted as element names; anything else is cut down to a harmless one.
        None => action
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(64)
            .collect(),
    };
    let mut xml = String::with_capacity(512);
    xml.push_str("<?xml version=\"1.0\"?><");
    xml.push_str(&name);
    xml.push_str("Response xmlns=\"");
    xml.push_str(XMLNS);
    xml.push_str("\">");
    if let Some(members) = spec.and_then(|s| s.output) {
        xml.push('<');
        xml.push_str(&name);
        xml.push_str("Result");
        let open_end = xml.len();
        xml.push('>');
        if let Some(object) = output.as_object() {
            write_members(&mut xml, members, object);
        }
        if xml.len() == open_end + 1 {
            // AWS's empty result (ReceiveMessage with no message) is `<ReceiveMessageResult/>`.
            xml.truncate(open_end);
            xml.push_str("/>");
        } else {
            xml.push_str("</");
            xml.push_str(&name);
            xml.push_str("Result>");
        }
    }
    xml.push_str("<ResponseMetadata>");
    push_element(&mut xml, "RequestId", request_id);
    xml.push_str("</ResponseMetadata></");
    xml.push_str(&name);
    xml.push_str("Response>");
    xml
}

/// An error reply in the query protocol: `<ErrorResponse><Error><Type>Sender|Receiver</Type><Code>…</Code>
/// <Message>…</Message><Detail/></Error><RequestId>…</RequestId></ErrorResponse>`. `code` is the legacy query code
/// (`AWS.SimpleQueueService.NonExistentQueue`, `InvalidParameterValue`), which query clients map to exceptions.
pub fn error_xml(code: &str, message: &str, sender_fault: bool, request_id: &str) -> String {
    let mut xml = String::with_capacity(256 + message.len());
    xml.push_str("<?xml version=\"1.0\"?><ErrorResponse xmlns=\"");
    xml.push_str(XMLNS);
    xml.push_str("\"><Error>");
    push_element(
        &mut xml,
        "Type",
        if sender_fault { "Sender" } else { "Receiver" },
    );
    push_element(&mut xml, "Code", code);
    push_element(&mut xml, "Message", message);
    xml.push_str("<Detail/></Error>");
    push_element(&mut xml, "RequestId", request_id);
    xml.push_str("</ErrorResponse>");
    xml
}

// ---- The model: every action's input and output, from botocore 1.34.89's query service-2.json, with the JSON
// ---- model's member names (identical but for ReceiveMessage's MessageSystemAttributeNames, which is JSON-only).

/// One member of a structure: its name on the query wire (form key segment, XML element) and in JSON.
struct Member {
    /// The form key segment and XML element name: the model's `locationName`, for flattened lists the member's.
    wire: &'static str,
    /// The JSON protocol's member name (the model's member name).
    json: &'static str,
    kind: Kind,
}

/// How a member is laid out on both wires.
enum Kind {
    /// A string, or a blob (base64 text on both wires).
    Str,
    /// An integer or long: decimal text in the form and in XML, a number in JSON. Every integer *input* of SQS is
    /// 32-bit; the longs (move-task counters, `StartedTimestamp`) are outputs only.
    Int,
    /// A boolean: `true`/`false` text, a JSON boolean.
    Bool,
    /// A flattened list: `{wire}.N` in the form, `<wire>` repeated in XML. An empty list is sent as `{json}=`.
    List(&'static Kind),
    /// A flattened map: `{wire}.N.{key}` and `{wire}.N.{value}` in the form; `<wire><key/><value/></wire>` repeated
    /// in XML; a JSON object.
    Map {
        key: &'static str,
        value: &'static str,
        of: &'static Kind,
    },
    /// A structure: `{wire}.{member}` in the form, nested elements in XML.
    Struct(&'static [Member]),
}

impl Kind {
    /// Scalars take one form pair under exactly their key; the others take the keys below theirs.
    fn is_scalar(&self) -> bool {
        matches!(self, Kind::Str | Kind::Int | Kind::Bool)
    }
}

/// One action: its name (`Action=`, `{name}Response`, `{name}Result`) and the members of its input and output.
struct Action {
    name: &'static str,
    input: &'static [Member],
    /// `None` for actions whose reply carries only `ResponseMetadata`.
    output: Option<&'static [Member]>,
}

const fn member(name: &'static str, kind: Kind) -> Member {
    Member {
        wire: name,
        json: name,
        kind,
    }
}

const fn string(name: &'static str) -> Member {
    member(name, Kind::Str)
}

const fn int(name: &'static str) -> Member {
    member(name, Kind::Int)
}

const fn list(wire: &'static str, json: &'static str, of: &'static Kind) -> Member {
    Member {
        wire,
        json,
        kind: Kind::List(of),
    }
}

const fn map(
    wire: &'static str,
    json: &'static str,
    key: &'static str,
    value: &'static str,
    of: &'static Kind,
) -> Member {
    Member {
        wire,
        json,
        kind: Kind::Map { key, value, of },
    }
}

const QUEUE_URL: Member = string("QueueUrl");
const RECEIPT_HANDLE: Member = string("ReceiptHandle");
const ID: Member = string("Id");
const NEXT_TOKEN: Member = string("NextToken");
const MAX_RESULTS: Member = int("MaxResults");

/// MessageAttributeValue and MessageSystemAttributeValue (same members). The list values are reserved by AWS.
const ATTRIBUTE_VALUE: Kind = Kind::Struct(&[
    string("StringValue"),
    string("BinaryValue"),
    list("StringListValue", "StringListValues", &Kind::Str),
    list("BinaryListValue", "BinaryListValues", &Kind::Str),
    string("DataType"),
]);
const MESSAGE_ATTRIBUTES: Member = map(
    "MessageAttribute",
    "MessageAttributes",
    "Name",
    "Value",
    &ATTRIBUTE_VALUE,
);
const MESSAGE_SYSTEM_ATTRIBUTES: Member = map(
    "MessageSystemAttribute",
    "MessageSystemAttributes",
    "Name",
    "Value",
    &ATTRIBUTE_VALUE,
);
/// Queue attributes (CreateQueue, SetQueueAttributes, GetQueueAttributes) and a message's system attributes.
const ATTRIBUTES: Member = map("Attribute", "Attributes", "Name", "Value", &Kind::Str);
const ATTRIBUTE_NAMES: Member = list("AttributeName", "AttributeNames", &Kind::Str);
const TAGS: Member = map("Tag", "Tags", "Key", "Value", &Kind::Str);

const BATCH_ERRORS: Member = list(
    "BatchResultErrorEntry",
    "Failed",
    &Kind::Struct(&[
        ID,
        member("SenderFault", Kind::Bool),
        string("Code"),
        string("Message"),
    ]),
);
/// The `Successful` entries of DeleteMessageBatch and ChangeMessageVisibilityBatch: just the `Id`.
const ID_ONLY: Kind = Kind::Struct(&[ID]);
const QUEUE_URL_ONLY: &[Member] = &[QUEUE_URL];

const MESSAGE: Kind = Kind::Struct(&[
    string("MessageId"),
    RECEIPT_HANDLE,
    string("MD5OfBody"),
    string("Body"),
    ATTRIBUTES,
    string("MD5OfMessageAttributes"),
    MESSAGE_ATTRIBUTES,
]);

const SEND_ENTRY: Kind = Kind::Struct(&[
    ID,
    string("MessageBody"),
    int("DelaySeconds"),
    MESSAGE_ATTRIBUTES,
    MESSAGE_SYSTEM_ATTRIBUTES,
    string("MessageDeduplicationId"),
    string("MessageGroupId"),
]);

const MOVE_TASK: Kind = Kind::Struct(&[
    string("TaskHandle"),
    string("Status"),
    string("SourceArn"),
    string("DestinationArn"),
    int("MaxNumberOfMessagesPerSecond"),
    int("ApproximateNumberOfMessagesMoved"),
    int("ApproximateNumberOfMessagesToMove"),
    string("FailureReason"),
    int("StartedTimestamp"),
]);

/// Every action of the SQS API, by name.
static ACTIONS: &[Action] = &[
    Action {
        name: "AddPermission",
        input: &[
            QUEUE_URL,
            string("Label"),
            list("AWSAccountId", "AWSAccountIds", &Kind::Str),
            list("ActionName", "Actions", &Kind::Str),
        ],
        output: None,
    },
    Action {
        name: "CancelMessageMoveTask",
        input: &[string("TaskHandle")],
        output: Some(&[int("ApproximateNumberOfMessagesMoved")]),
    },
    Action {
        name: "ChangeMessageVisibility",
        input: &[QUEUE_URL, RECEIPT_HANDLE, int("VisibilityTimeout")],
        output: None,
    },
    Action {
        name: "ChangeMessageVisibilityBatch",
        input: &[
            QUEUE_URL,
            list(
                "ChangeMessageVisibilityBatchRequestEntry",
                "Entries",
                &Kind::Struct(&[ID, RECEIPT_HANDLE, int("VisibilityTimeout")]),
            ),
        ],
        output: Some(&[
            list(
                "ChangeMessageVisibilityBatchResultEntry",
                "Successful",
                &ID_ONLY,
            ),
            BATCH_ERRORS,
        ]),
    },
    Action {
        name: "CreateQueue",
        input: &[
            string("QueueName"),
            ATTRIBUTES,
            // Lower-case `tags` in both models.
            map("Tag", "tags", "Key", "Value", &Kind::Str),
        ],
        output: Some(QUEUE_URL_ONLY),
    },
    Action {
        name: "DeleteMessage",
        input: &[QUEUE_URL, RECEIPT_HANDLE],
        output: None,
    },
    Action {
        name: "DeleteMessageBatch",
        input: &[
            QUEUE_URL,
            list(
                "DeleteMessageBatchRequestEntry",
                "Entries",
                &Kind::Struct(&[ID, RECEIPT_HANDLE]),
            ),
        ],
        output: Some(&[
            list("DeleteMessageBatchResultEntry", "Successful", &ID_ONLY),
            BATCH_ERRORS,
        ]),
    },
    Action {
        name: "DeleteQueue",
        input: QUEUE_URL_ONLY,
        output: None,
    },
    Action {
        name: "GetQueueAttributes",
        input: &[QUEUE_URL, ATTRIBUTE_NAMES],
        output: Some(&[ATTRIBUTES]),
    },
    Action {
        name: "GetQueueUrl",
        input: &[string("QueueName"), string("QueueOwnerAWSAccountId")],
        output: Some(QUEUE_URL_ONLY),
    },
    Action {
        name: "ListDeadLetterSourceQueues",
        input: &[QUEUE_URL, NEXT_TOKEN, MAX_RESULTS],
        // Lower-case `queueUrls` in both models.
        output: Some(&[list("QueueUrl", "queueUrls", &Kind::Str), NEXT_TOKEN]),
    },
    Action {
        name: "ListMessageMoveTasks",
        input: &[string("SourceArn"), MAX_RESULTS],
        output: Some(&[list(
            "ListMessageMoveTasksResultEntry",
            "Results",
            &MOVE_TASK,
        )]),
    },
    Action {
        name: "ListQueueTags",
        input: QUEUE_URL_ONLY,
        output: Some(&[TAGS]),
    },
    Action {
        name: "ListQueues",
        input: &[string("QueueNamePrefix"), NEXT_TOKEN, MAX_RESULTS],
        output: Some(&[list("QueueUrl", "QueueUrls", &Kind::Str), NEXT_TOKEN]),
    },
    Action {
        name: "PurgeQueue",
        input: QUEUE_URL_ONLY,
        output: None,
    },
    Action {
        name: "ReceiveMessage",
        input: &[
            QUEUE_URL,
            // Query clients send the system attribute names as `AttributeName.N` (the Smithy model's xmlName of
            // MessageSystemAttributeNames too): the handler takes AttributeNames ∪ MessageSystemAttributeNames.
            ATTRIBUTE_NAMES,
            list(
                "MessageSystemAttributeName",
                "MessageSystemAttributeNames",
                &Kind::Str,
            ),
            list("MessageAttributeName", "MessageAttributeNames", &Kind::Str),
            int("MaxNumberOfMessages"),
            int("VisibilityTimeout"),
            int("WaitTimeSeconds"),
            string("ReceiveRequestAttemptId"),
        ],
        output: Some(&[list("Message", "Messages", &MESSAGE)]),
    },
    Action {
        name: "RemovePermission",
        input: &[QUEUE_URL, string("Label")],
        output: None,
    },
    Action {
        name: "SendMessage",
        input: &[
            QUEUE_URL,
            string("MessageBody"),
            int("DelaySeconds"),
            MESSAGE_ATTRIBUTES,
            MESSAGE_SYSTEM_ATTRIBUTES,
            string("MessageDeduplicationId"),
            string("MessageGroupId"),
        ],
        output: Some(&[
            string("MD5OfMessageBody"),
            string("MD5OfMessageAttributes"),
            string("MD5OfMessageSystemAttributes"),
            string("MessageId"),
            string("SequenceNumber"),
        ]),
    },
    Action {
        name: "SendMessageBatch",
        input: &[
            QUEUE_URL,
            list("SendMessageBatchRequestEntry", "Entries", &SEND_ENTRY),
        ],
        output: Some(&[
            list(
                "SendMessageBatchResultEntry",
                "Successful",
                &Kind::Struct(&[
                    ID,
                    string("MessageId"),
                    string("MD5OfMessageBody"),
                    string("MD5OfMessageAttributes"),
                    string("MD5OfMessageSystemAttributes"),
                    string("SequenceNumber"),
                ]),
            ),
            BATCH_ERRORS,
        ]),
    },
    Action {
        name: "SetQueueAttributes",
        input: &[QUEUE_URL, ATTRIBUTES],
        output: None,
    },
    Action {
        name: "StartMessageMoveTask",
        input: &[
            string("SourceArn"),
            string("DestinationArn"),
            int("MaxNumberOfMessagesPerSecond"),
        ],
        output: Some(&[string("TaskHandle")]),
    },
    Action {
        name: "TagQueue",
        input: &[QUEUE_URL, TAGS],
        output: None,
    },
    Action {
        name: "UntagQueue",
        input: &[QUEUE_URL, list("TagKey", "TagKeys", &Kind::Str)],
        output: None,
    },
];

fn find_action(name: &str) -> Option<&'static Action> {
    ACTIONS.iter().find(|a| a.name == name)
}

// ---- Form -> JSON.

/// A form pair seen from the structure being parsed: `key` is what follows that structure's prefix (`None` when the
/// pair's key *is* the prefix, e.g. `AttributeName.1` seen from the list `AttributeName`'s element 1).
#[derive(Clone, Copy)]
struct Pair<'a> {
    key: Option<&'a str>,
    value: &'a str,
}

/// Collects each member's pairs out of `pairs` (keys relative to the structure) and converts them.
/// `path` is the structure's own key prefix (`""` or `SendMessageBatchRequestEntry.2.`), for error messages.
fn parse_members(
    members: &[Member],
    pairs: &[Pair<'_>],
    path: &str,
) -> Result<Map<String, Value>, QueryError> {
    let mut object = Map::new();
    for m in members {
        let mut own = Vec::new();
        let compound = !m.kind.is_scalar();
        for pair in pairs {
            let Some(key) = pair.key else { continue };
            let rest = if key == m.wire || (matches!(m.kind, Kind::List(_)) && key == m.json) {
                // botocore sends an empty list as its JSON member name with an empty value (`AttributeNames=`).
                Some(None)
            } else if compound {
                key.strip_prefix(m.wire)
                    .and_then(|r| r.strip_prefix('.'))
                    .map(Some)
            } else {
                None
            };
            if let Some(rest) = rest {
                own.push(Pair {
                    key: rest,
                    value: pair.value,
                });
            }
        }
        let member_path = format!("{path}{}", m.wire);
        if let Some(value) = parse_value(&m.kind, &own, &member_path)? {
            object.insert(m.json.to_owned(), value);
        }
    }
    Ok(object)
}

/// Converts the pairs of one member (keys relative to the member) to its JSON value; `None` when absent.
fn parse_value(kind: &Kind, pairs: &[Pair<'_>], path: &str) -> Result<Option<Value>, QueryError> {
    let mut exact = pairs.iter().filter(|p| p.key.is_none()).map(|p| p.value);
    let first = exact.next();
    match kind {
        Kind::Str | Kind::Int | Kind::Bool => {
            if exact.next().is_some() {
                return Err(error(format!(
                    "The parameter {path} was given more than once."
                )));
            }
            first.map(|text| scalar(kind, text, path)).transpose()
        }
        Kind::List(of) => {
            let empty = empty_marker(first, path)?;
            let mut items = Vec::new();
            for (index, group) in by_index(pairs, path)? {
                let item_path = format!("{path}.{index}");
                match parse_value(of, &group, &item_path)? {
                    Some(item) => items.push(item),
                    None => return Err(missing(&item_path)),
                }
            }
            Ok((empty || !items.is_empty()).then_some(Value::Array(items)))
        }
        Kind::Map { key, value, of } => {
            let empty = empty_marker(first, path)?;
            let mut object = Map::new();
            for (index, group) in by_index(pairs, path)? {
                let entry_path = format!("{path}.{index}");
                let key_path = format!("{entry_path}.{key}");
                let name = match parse_value(
                    &Kind::Str,
                    &sub_pairs(&group, key, &Kind::Str),
                    &key_path,
                )? {
                    Some(Value::String(name)) => name,
                    _ => return Err(missing(&key_path)),
                };
                let value_path = format!("{entry_path}.{value}");
                let value_pairs = sub_pairs(&group, value, of);
                let Some(item) = parse_value(of, &value_pairs, &value_path)? else {
                    return Err(missing(&value_path));
                };
                if object.contains_key(&name) {
                    return Err(error(format!(
                        "The key {} appears more than once in {path}.",
                        quote(&name)
                    )));
                }
                object.insert(name, item);
            }
            Ok((empty || !object.is_empty()).then_some(Value::Object(object)))
        }
        Kind::Struct(members) => {
            let object = parse_members(members, pairs, &format!("{path}."))?;
            Ok((!object.is_empty()).then_some(Value::Object(object)))
        }
    }
}

/// The pairs under `name` (keys relative to it) within one map entry's pairs.
fn sub_pairs<'a>(group: &[Pair<'a>], name: &str, of: &Kind) -> Vec<Pair<'a>> {
    let compound = !of.is_scalar();
    group
        .iter()
        .filter_map(|p| {
            let key = p.key?;
            if key == name {
                return Some(Pair {
                    key: None,
                    value: p.value,
                });
            }
            let rest = key.strip_prefix(name)?.strip_prefix('.')?;
            compound.then_some(Pair {
                key: Some(rest),
                value: p.value,
            })
        })
        .collect()
}

/// A collection's key without an index: with an empty value it stands for an empty collection; anything else is
/// malformed.
fn empty_marker(value: Option<&str>, path: &str) -> Result<bool, QueryError> {
    match value {
        None => Ok(false),
        Some("") => Ok(true),
        Some(_) => Err(error(format!(
            "The parameter {path} needs an index: {path}.1, {path}.2, …"
        ))),
    }
}

/// Groups a collection's indexed pairs (`N` or `N.rest`) by index, in index order. Gaps are tolerated; an index
/// outside `1..=MAX_FORM_INDEX` is refused before anything is stored, so a hostile `N` costs nothing.
fn by_index<'a>(
    pairs: &[Pair<'a>],
    path: &str,
) -> Result<BTreeMap<u32, Vec<Pair<'a>>>, QueryError> {
    let mut groups: BTreeMap<u32, Vec<Pair<'a>>> = BTreeMap::new();
    for pair in pairs {
        let Some(key) = pair.key else { continue };
        let (segment, rest) = match key.split_once('.') {
            Some((segment, rest)) => (segment, Some(rest)),
            None => (key, None),
        };
        let Some(index) = parse_index(segment) else {
            return Err(error(format!(
                "Invalid parameter {path}.{}: the index must be a number from 1 to {MAX_FORM_INDEX}.",
                quote(segment)
            )));
        };
        groups.entry(index).or_default().push(Pair {
            key: rest,
            value: pair.value,
        });
    }
    Ok(groups)
}

/// `1..=MAX_FORM_INDEX` in plain decimal (no sign, no leading zero); an over-long number is just an overflow.
fn parse_index(segment: &str) -> Option<u32> {
    if segment.starts_with('0') || !segment.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    segment
        .parse::<u32>()
        .ok()
        .filter(|index| (1..=MAX_FORM_INDEX).contains(index))
}

fn scalar(kind: &Kind, text: &str, path: &str) -> Result<Value, QueryError> {
    match kind {
        Kind::Int => text
            .parse::<i32>()
            .map(|n| Value::Number(Number::from(n)))
            .map_err(|_| invalid_value(text, path, "must be an integer")),
        Kind::Bool => match text {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err(invalid_value(text, path, "must be true or false")),
        },
        _ => Ok(Value::String(text.to_owned())),
    }
}

fn invalid_value(text: &str, path: &str, reason: &str) -> QueryError {
    error(format!(
        "Value {} for parameter {path} is invalid. Reason: {reason}.",
        quote(text)
    ))
}

fn missing(path: &str) -> QueryError {
    error(format!("The request must contain the parameter {path}."))
}

fn error(message: String) -> QueryError {
    QueryError { message }
}

/// Client input as quoted in an error message: at most `MAX_QUOTED_CHARS` characters.
fn quote(text: &str) -> String {
    let mut chars = text.chars();
    let mut quoted: String = chars.by_ref().take(MAX_QUOTED_CHARS).collect();
    if chars.next().is_some() {
        quoted.push('…');
    }
    quoted
}

// ---- JSON -> XML.

fn write_members(xml: &mut String, members: &[Member], object: &Map<String, Value>) {
    for m in members {
        if let Some(value) = object.get(m.json) {
            write_value(xml, m.wire, &m.kind, value);
        }
    }
}

/// Writes `value` as element(s) named `tag`: one element for a scalar or structure, one per item for the flattened
/// lists and maps. A value of the wrong JSON type writes nothing.
fn write_value(xml: &mut String, tag: &str, kind: &Kind, value: &Value) {
    match kind {
        Kind::Str | Kind::Int | Kind::Bool => match value {
            Value::String(s) => push_element(xml, tag, s),
            Value::Number(n) => push_element(xml, tag, &n.to_string()),
            Value::Bool(b) => push_element(xml, tag, if *b { "true" } else { "false" }),
            Value::Null | Value::Array(_) | Value::Object(_) => {}
        },
        Kind::List(of) => {
            for item in value.as_array().into_iter().flatten() {
                write_value(xml, tag, of, item);
            }
        }
        Kind::Map {
            key,
            value: value_tag,
            of,
        } => {
            for (name, item) in value.as_object().into_iter().flatten() {
                open(xml, tag);
                push_element(xml, key, name);
                write_value(xml, value_tag, of, item);
                close(xml, tag);
            }
        }
        Kind::Struct(members) => {
            if let Some(object) = value.as_object() {
                open(xml, tag);
                write_members(xml, members, object);
                close(xml, tag);
            }
        }
    }
}

fn open(xml: &mut String, tag: &str) {
    xml.push('<');
    xml.push_str(tag);
    xml.push('>');
}

fn close(xml: &mut String, tag: &str) {
    xml.push_str("</");
    xml.push_str(tag);
    xml.push('>');
}

fn push_element(xml: &mut String, tag: &str, text: &str) {
    open(xml, tag);
    push_text(xml, text);
    close(xml, tag);
}

/// Appends `text` escaped for an XML 1.0 text node. `\r` becomes `&#xD;` (a bare one would reach the client as
/// `\n`, and Java SDK's body MD5 check would fail). Characters XML 1.0 cannot carry even as references (C0 controls
/// but tab and newline, U+FFFE, U+FFFF) become U+FFFD, so the reply always parses; SQS refuses them in bodies anyway.
fn push_text(xml: &mut String, text: &str) {
    let mut clean_from = 0;
    for (at, c) in text.char_indices() {
        let replacement = match c {
            '&' => "&amp;",
            '<' => "&lt;",
            '>' => "&gt;",
            '"' => "&quot;",
            '\'' => "&apos;",
            '\r' => "&#xD;",
            '\t' | '\n' => continue,
            '\u{0}'..='\u{1f}' | '\u{fffe}' | '\u{ffff}' => "\u{fffd}",
            _ => continue,
        };
        xml.push_str(&text[clean_from..at]);
        xml.push_str(replacement);
        clean_from = at + c.len_utf8();
    }
    xml.push_str(&text[clean_from..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every action of the SQS API (the face's own list).
    const ALL_ACTIONS: [&str; 23] = crate::sqs::actions::ACTIONS;

    /// Form bodies exactly as botocore 1.34.89 (the last query-protocol botocore) sent them, with the parameters
    /// it was given, in JSON (blobs base64); one or more per action.
    const FORM_VECTORS: &[(&str, &str, &str)] = &[
        (
            "AddPermission",
            r#"Action=AddPermission&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&Label=l1&AWSAccountId.1=111122223333&AWSAccountId.2=444455556666&ActionName.1=SendMessage&ActionName.2=ReceiveMessage"#,
            r#"{"AWSAccountIds":["111122223333","444455556666"],"Actions":["SendMessage","ReceiveMessage"],"Label":"l1","QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "CancelMessageMoveTask",
            r#"Action=CancelMessageMoveTask&Version=2012-11-05&TaskHandle=eyJ0YXNrSWQiOiJkYTFkOWRhMy1mZjg0LTQ1YzAtODM1Zi1hYTgwZjY1ZmRkNjYifQ%3D%3D"#,
            r#"{"TaskHandle":"eyJ0YXNrSWQiOiJkYTFkOWRhMy1mZjg0LTQ1YzAtODM1Zi1hYTgwZjY1ZmRkNjYifQ=="}"#,
        ),
        (
            "ChangeMessageVisibility",
            r#"Action=ChangeMessageVisibility&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&ReceiptHandle=rh%2B%2F%3D1&VisibilityTimeout=43200"#,
            r#"{"QueueUrl":"http://127.0.0.1:9324/000000000000/q1","ReceiptHandle":"rh+/=1","VisibilityTimeout":43200}"#,
        ),
        (
            "ChangeMessageVisibilityBatch",
            r#"Action=ChangeMessageVisibilityBatch&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&ChangeMessageVisibilityBatchRequestEntry.1.Id=a&ChangeMessageVisibilityBatchRequestEntry.1.ReceiptHandle=r1&ChangeMessageVisibilityBatchRequestEntry.1.VisibilityTimeout=0&ChangeMessageVisibilityBatchRequestEntry.2.Id=b&ChangeMessageVisibilityBatchRequestEntry.2.ReceiptHandle=r2"#,
            r#"{"Entries":[{"Id":"a","ReceiptHandle":"r1","VisibilityTimeout":0},{"Id":"b","ReceiptHandle":"r2"}],"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "CreateQueue",
            r#"Action=CreateQueue&Version=2012-11-05&QueueName=q.fifo&Attribute.1.Name=VisibilityTimeout&Attribute.1.Value=5&Attribute.2.Name=FifoQueue&Attribute.2.Value=true&Attribute.3.Name=RedrivePolicy&Attribute.3.Value=%7B%22deadLetterTargetArn%22%3A%22arn%3Aaws%3Asqs%3Aus-east-1%3A000000000000%3Adlq%22%2C%22maxReceiveCount%22%3A%223%22%7D&Tag.1.Key=k&Tag.1.Value=v&Tag.2.Key=team&Tag.2.Value=a%3Db%26c"#,
            r#"{"Attributes":{"FifoQueue":"true","RedrivePolicy":"{\"deadLetterTargetArn\":\"arn:aws:sqs:us-east-1:000000000000:dlq\",\"maxReceiveCount\":\"3\"}","VisibilityTimeout":"5"},"QueueName":"q.fifo","tags":{"k":"v","team":"a=b&c"}}"#,
        ),
        (
            "CreateQueue",
            r#"Action=CreateQueue&Version=2012-11-05&QueueName=plain"#,
            r#"{"QueueName":"plain"}"#,
        ),
        (
            "DeleteMessage",
            r#"Action=DeleteMessage&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&ReceiptHandle=rh"#,
            r#"{"QueueUrl":"http://127.0.0.1:9324/000000000000/q1","ReceiptHandle":"rh"}"#,
        ),
        (
            "DeleteMessageBatch",
            r#"Action=DeleteMessageBatch&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&DeleteMessageBatchRequestEntry.1.Id=a&DeleteMessageBatchRequestEntry.1.ReceiptHandle=r1&DeleteMessageBatchRequestEntry.2.Id=b&DeleteMessageBatchRequestEntry.2.ReceiptHandle=r2"#,
            r#"{"Entries":[{"Id":"a","ReceiptHandle":"r1"},{"Id":"b","ReceiptHandle":"r2"}],"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "DeleteQueue",
            r#"Action=DeleteQueue&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1"#,
            r#"{"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "GetQueueAttributes",
            r#"Action=GetQueueAttributes&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&AttributeName.1=All"#,
            r#"{"AttributeNames":["All"],"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "GetQueueAttributes",
            r#"Action=GetQueueAttributes&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&AttributeName.1=QueueArn&AttributeName.2=ApproximateNumberOfMessages"#,
            r#"{"AttributeNames":["QueueArn","ApproximateNumberOfMessages"],"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "GetQueueAttributes",
            r#"Action=GetQueueAttributes&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&AttributeNames="#,
            r#"{"AttributeNames":[],"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "GetQueueUrl",
            r#"Action=GetQueueUrl&Version=2012-11-05&QueueName=q1&QueueOwnerAWSAccountId=000000000000"#,
            r#"{"QueueName":"q1","QueueOwnerAWSAccountId":"000000000000"}"#,
        ),
        (
            "ListDeadLetterSourceQueues",
            r#"Action=ListDeadLetterSourceQueues&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&NextToken=tok&MaxResults=1000"#,
            r#"{"MaxResults":1000,"NextToken":"tok","QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "ListMessageMoveTasks",
            r#"Action=ListMessageMoveTasks&Version=2012-11-05&SourceArn=arn%3Aaws%3Asqs%3Aus-east-1%3A000000000000%3Adlq&MaxResults=10"#,
            r#"{"MaxResults":10,"SourceArn":"arn:aws:sqs:us-east-1:000000000000:dlq"}"#,
        ),
        (
            "ListQueueTags",
            r#"Action=ListQueueTags&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1"#,
            r#"{"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "ListQueues",
            r#"Action=ListQueues&Version=2012-11-05"#,
            r#"{}"#,
        ),
        (
            "ListQueues",
            r#"Action=ListQueues&Version=2012-11-05&QueueNamePrefix=q&NextToken=t&MaxResults=1"#,
            r#"{"MaxResults":1,"NextToken":"t","QueueNamePrefix":"q"}"#,
        ),
        (
            "PurgeQueue",
            r#"Action=PurgeQueue&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1"#,
            r#"{"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "ReceiveMessage",
            r#"Action=ReceiveMessage&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&AttributeName.1=All&MessageAttributeName.1=All&MaxNumberOfMessages=10&WaitTimeSeconds=20"#,
            r#"{"AttributeNames":["All"],"MaxNumberOfMessages":10,"MessageAttributeNames":["All"],"QueueUrl":"http://127.0.0.1:9324/000000000000/q1","WaitTimeSeconds":20}"#,
        ),
        (
            "ReceiveMessage",
            r#"Action=ReceiveMessage&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&AttributeName.1=SentTimestamp&AttributeName.2=ApproximateReceiveCount&MessageAttributeName.1=Foo&MessageAttributeName.2=Bar.%2A&VisibilityTimeout=0&ReceiveRequestAttemptId=att-1"#,
            r#"{"AttributeNames":["SentTimestamp","ApproximateReceiveCount"],"MessageAttributeNames":["Foo","Bar.*"],"QueueUrl":"http://127.0.0.1:9324/000000000000/q1","ReceiveRequestAttemptId":"att-1","VisibilityTimeout":0}"#,
        ),
        (
            "RemovePermission",
            r#"Action=RemovePermission&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&Label=l1"#,
            r#"{"Label":"l1","QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "SendMessage",
            r#"Action=SendMessage&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&MessageBody=hello%0D%0Aw%C3%B6rld+%26+%3Cx%3E+%22q%22+%27a%27+%2B%25%3D%09%F0%9F%98%80&DelaySeconds=5&MessageAttribute.1.Name=Foo&MessageAttribute.1.Value.DataType=String&MessageAttribute.1.Value.StringValue=Bar+%26+%3Cbaz%3E+%C3%BCn%C3%AF+%F0%9F%98%80&MessageAttribute.2.Name=Bin&MessageAttribute.2.Value.DataType=Binary&MessageAttribute.2.Value.BinaryValue=AAH%2F&MessageAttribute.3.Name=Num&MessageAttribute.3.Value.DataType=Number.int&MessageAttribute.3.Value.StringValue=42&MessageAttribute.4.Name=L&MessageAttribute.4.Value.DataType=String&MessageAttribute.4.Value.StringListValue.1=a&MessageAttribute.4.Value.StringListValue.2=b+c&MessageAttribute.4.Value.BinaryListValue.1=eA%3D%3D&MessageAttribute.4.Value.BinaryListValue.2=eXo%3D&MessageSystemAttribute.1.Name=AWSTraceHeader&MessageSystemAttribute.1.Value.DataType=String&MessageSystemAttribute.1.Value.StringValue=Root%3D1-5759e988-bd862e3fe1be46a994272793%3BSampled%3D1&MessageDeduplicationId=d1&MessageGroupId=g1"#,
            r#"{"DelaySeconds":5,"MessageAttributes":{"Bin":{"BinaryValue":"AAH/","DataType":"Binary"},"Foo":{"DataType":"String","StringValue":"Bar & <baz> ünï 😀"},"L":{"BinaryListValues":["eA==","eXo="],"DataType":"String","StringListValues":["a","b c"]},"Num":{"DataType":"Number.int","StringValue":"42"}},"MessageBody":"hello\r\nwörld & <x> \"q\" 'a' +%=\t😀","MessageDeduplicationId":"d1","MessageGroupId":"g1","MessageSystemAttributes":{"AWSTraceHeader":{"DataType":"String","StringValue":"Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"}},"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "SendMessage",
            r#"Action=SendMessage&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&MessageBody=x"#,
            r#"{"MessageBody":"x","QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "SendMessageBatch",
            r#"Action=SendMessageBatch&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&SendMessageBatchRequestEntry.1.Id=a&SendMessageBatchRequestEntry.1.MessageBody=x&SendMessageBatchRequestEntry.1.MessageAttribute.1.Name=Foo&SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType=String&SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue=Bar&SendMessageBatchRequestEntry.2.Id=b&SendMessageBatchRequestEntry.2.MessageBody=y&SendMessageBatchRequestEntry.2.DelaySeconds=900&SendMessageBatchRequestEntry.2.MessageGroupId=g&SendMessageBatchRequestEntry.2.MessageDeduplicationId=d&SendMessageBatchRequestEntry.2.MessageSystemAttribute.1.Name=AWSTraceHeader&SendMessageBatchRequestEntry.2.MessageSystemAttribute.1.Value.DataType=String&SendMessageBatchRequestEntry.2.MessageSystemAttribute.1.Value.StringValue=Root%3D1-5759e988-bd862e3fe1be46a994272793%3BSampled%3D1&SendMessageBatchRequestEntry.2.MessageAttribute.1.Name=B&SendMessageBatchRequestEntry.2.MessageAttribute.1.Value.DataType=Binary&SendMessageBatchRequestEntry.2.MessageAttribute.1.Value.BinaryValue=AA%3D%3D&SendMessageBatchRequestEntry.2.MessageAttribute.2.Name=N&SendMessageBatchRequestEntry.2.MessageAttribute.2.Value.DataType=Number&SendMessageBatchRequestEntry.2.MessageAttribute.2.Value.StringValue=-1.5"#,
            r#"{"Entries":[{"Id":"a","MessageAttributes":{"Foo":{"DataType":"String","StringValue":"Bar"}},"MessageBody":"x"},{"DelaySeconds":900,"Id":"b","MessageAttributes":{"B":{"BinaryValue":"AA==","DataType":"Binary"},"N":{"DataType":"Number","StringValue":"-1.5"}},"MessageBody":"y","MessageDeduplicationId":"d","MessageGroupId":"g","MessageSystemAttributes":{"AWSTraceHeader":{"DataType":"String","StringValue":"Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"}}}],"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "SendMessageBatch",
            r#"Action=SendMessageBatch&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&Entries="#,
            r#"{"Entries":[],"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "SetQueueAttributes",
            r#"Action=SetQueueAttributes&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&Attribute.1.Name=DelaySeconds&Attribute.1.Value=10&Attribute.2.Name=Policy&Attribute.2.Value=%7B%22Version%22%3A%222012-10-17%22%7D"#,
            r#"{"Attributes":{"DelaySeconds":"10","Policy":"{\"Version\":\"2012-10-17\"}"},"QueueUrl":"http://127.0.0.1:9324/000000000000/q1"}"#,
        ),
        (
            "StartMessageMoveTask",
            r#"Action=StartMessageMoveTask&Version=2012-11-05&SourceArn=arn%3Aaws%3Asqs%3Aus-east-1%3A000000000000%3Adlq&DestinationArn=arn%3Aaws%3Asqs%3Aus-east-1%3A000000000000%3Aq1&MaxNumberOfMessagesPerSecond=500"#,
            r#"{"DestinationArn":"arn:aws:sqs:us-east-1:000000000000:q1","MaxNumberOfMessagesPerSecond":500,"SourceArn":"arn:aws:sqs:us-east-1:000000000000:dlq"}"#,
        ),
        (
            "StartMessageMoveTask",
            r#"Action=StartMessageMoveTask&Version=2012-11-05&SourceArn=arn%3Aaws%3Asqs%3Aus-east-1%3A000000000000%3Adlq"#,
            r#"{"SourceArn":"arn:aws:sqs:us-east-1:000000000000:dlq"}"#,
        ),
        (
            "TagQueue",
            r#"Action=TagQueue&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&Tag.1.Key=k&Tag.1.Value=v&Tag.2.Key=k2&Tag.2.Value="#,
            r#"{"QueueUrl":"http://127.0.0.1:9324/000000000000/q1","Tags":{"k":"v","k2":""}}"#,
        ),
        (
            "UntagQueue",
            r#"Action=UntagQueue&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A9324%2F000000000000%2Fq1&TagKey.1=k&TagKey.2=k2"#,
            r#"{"QueueUrl":"http://127.0.0.1:9324/000000000000/q1","TagKeys":["k","k2"]}"#,
        ),
    ];

    /// Replies that botocore 1.34.89's query parser turned back into exactly the JSON output beside them.
    const XML_VECTORS: &[(&str, &str, &str)] = &[
        (
            "ReceiveMessage",
            r#"{"Messages":[{"Attributes":{"AWSTraceHeader":"Root=1;Sampled=1","ApproximateFirstReceiveTimestamp":"1250700979248","ApproximateReceiveCount":"5","SenderId":"195004372649","SentTimestamp":"1238099229000"},"Body":"hello\r\nwörld & <x> \"q\" 'a' ]]> \t😀   end","MD5OfBody":"fafb00f5732ab283681e124bf8747ed1","MD5OfMessageAttributes":"d25a6aea97eb8f585bfa92d314504a92","MessageAttributes":{"Bin":{"BinaryValue":"AAH/","DataType":"Binary"},"Foo":{"DataType":"String","StringValue":"Bar & <baz>"},"L":{"BinaryListValues":["eA==","eXo="],"DataType":"String","StringListValues":["a","b c"]},"Num":{"DataType":"Number.int","StringValue":"42"}},"MessageId":"5fea7756-0ea4-451a-a703-a558b933e274","ReceiptHandle":"MbZj6wDWli+JvwwJaBV+3dcjk2YW2vA3+STFFljTM8tJJg6HRG6PYSasuWXPJB+Cw=="},{"Body":"msg","MD5OfBody":"6e2baaf3b97dbeef01c0043275f9a0e7","MessageId":"m2","ReceiptHandle":"r2"}]}"#,
            r#"<?xml version="1.0"?><ReceiveMessageResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><ReceiveMessageResult><Message><MessageId>5fea7756-0ea4-451a-a703-a558b933e274</MessageId><ReceiptHandle>MbZj6wDWli+JvwwJaBV+3dcjk2YW2vA3+STFFljTM8tJJg6HRG6PYSasuWXPJB+Cw==</ReceiptHandle><MD5OfBody>fafb00f5732ab283681e124bf8747ed1</MD5OfBody><Body>hello&#xD;
wörld &amp; &lt;x&gt; &quot;q&quot; &apos;a&apos; ]]&gt; 	😀   end</Body><Attribute><Name>AWSTraceHeader</Name><Value>Root=1;Sampled=1</Value></Attribute><Attribute><Name>ApproximateFirstReceiveTimestamp</Name><Value>1250700979248</Value></Attribute><Attribute><Name>ApproximateReceiveCount</Name><Value>5</Value></Attribute><Attribute><Name>SenderId</Name><Value>195004372649</Value></Attribute><Attribute><Name>SentTimestamp</Name><Value>1238099229000</Value></Attribute><MD5OfMessageAttributes>d25a6aea97eb8f585bfa92d314504a92</MD5OfMessageAttributes><MessageAttribute><Name>Bin</Name><Value><BinaryValue>AAH/</BinaryValue><DataType>Binary</DataType></Value></MessageAttribute><MessageAttribute><Name>Foo</Name><Value><StringValue>Bar &amp; &lt;baz&gt;</StringValue><DataType>String</DataType></Value></MessageAttribute><MessageAttribute><Name>L</Name><Value><StringListValue>a</StringListValue><StringListValue>b c</StringListValue><BinaryListValue>eA==</BinaryListValue><BinaryListValue>eXo=</BinaryListValue><DataType>String</DataType></Value></MessageAttribute><MessageAttribute><Name>Num</Name><Value><StringValue>42</StringValue><DataType>Number.int</DataType></Value></MessageAttribute></Message><Message><MessageId>m2</MessageId><ReceiptHandle>r2</ReceiptHandle><MD5OfBody>6e2baaf3b97dbeef01c0043275f9a0e7</MD5OfBody><Body>msg</Body></Message></ReceiveMessageResult><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></ReceiveMessageResponse>"#,
        ),
        (
            "ReceiveMessage",
            r#"{}"#,
            r#"<?xml version="1.0"?><ReceiveMessageResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><ReceiveMessageResult/><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></ReceiveMessageResponse>"#,
        ),
        (
            "SendMessageBatch",
            r#"{"Failed":[{"Code":"InvalidParameterValue","Id":"c","Message":"One or more parameters cannot be validated. Reason: Message must be shorter than 1024 bytes.","SenderFault":true}],"Successful":[{"Id":"a","MD5OfMessageAttributes":"x","MD5OfMessageBody":"9dd4e461268c8034f5c8564e155c67a6","MD5OfMessageSystemAttributes":"y","MessageId":"m1","SequenceNumber":"1"},{"Id":"b","MD5OfMessageBody":"415290769594460e2e485922904f345d","MessageId":"m2"}]}"#,
            r#"<?xml version="1.0"?><SendMessageBatchResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><SendMessageBatchResult><SendMessageBatchResultEntry><Id>a</Id><MessageId>m1</MessageId><MD5OfMessageBody>9dd4e461268c8034f5c8564e155c67a6</MD5OfMessageBody><MD5OfMessageAttributes>x</MD5OfMessageAttributes><MD5OfMessageSystemAttributes>y</MD5OfMessageSystemAttributes><SequenceNumber>1</SequenceNumber></SendMessageBatchResultEntry><SendMessageBatchResultEntry><Id>b</Id><MessageId>m2</MessageId><MD5OfMessageBody>415290769594460e2e485922904f345d</MD5OfMessageBody></SendMessageBatchResultEntry><BatchResultErrorEntry><Id>c</Id><SenderFault>true</SenderFault><Code>InvalidParameterValue</Code><Message>One or more parameters cannot be validated. Reason: Message must be shorter than 1024 bytes.</Message></BatchResultErrorEntry></SendMessageBatchResult><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></SendMessageBatchResponse>"#,
        ),
        (
            "ListQueues",
            r#"{"NextToken":"tok","QueueUrls":["http://127.0.0.1:9324/000000000000/q1","http://127.0.0.1:9324/000000000000/q12","http://127.0.0.1:9324/000000000000/q13"]}"#,
            r#"<?xml version="1.0"?><ListQueuesResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><ListQueuesResult><QueueUrl>http://127.0.0.1:9324/000000000000/q1</QueueUrl><QueueUrl>http://127.0.0.1:9324/000000000000/q12</QueueUrl><QueueUrl>http://127.0.0.1:9324/000000000000/q13</QueueUrl><NextToken>tok</NextToken></ListQueuesResult><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></ListQueuesResponse>"#,
        ),
        (
            "GetQueueAttributes",
            r#"{"Attributes":{"ApproximateNumberOfMessages":"3","Policy":"{\"a\":\"<&>\"}","QueueArn":"arn:aws:sqs:us-east-1:000000000000:q1","RedrivePolicy":"{\"deadLetterTargetArn\":\"arn:aws:sqs:us-east-1:000000000000:dlq\",\"maxReceiveCount\":3}"}}"#,
            r#"<?xml version="1.0"?><GetQueueAttributesResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><GetQueueAttributesResult><Attribute><Name>ApproximateNumberOfMessages</Name><Value>3</Value></Attribute><Attribute><Name>Policy</Name><Value>{&quot;a&quot;:&quot;&lt;&amp;&gt;&quot;}</Value></Attribute><Attribute><Name>QueueArn</Name><Value>arn:aws:sqs:us-east-1:000000000000:q1</Value></Attribute><Attribute><Name>RedrivePolicy</Name><Value>{&quot;deadLetterTargetArn&quot;:&quot;arn:aws:sqs:us-east-1:000000000000:dlq&quot;,&quot;maxReceiveCount&quot;:3}</Value></Attribute></GetQueueAttributesResult><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></GetQueueAttributesResponse>"#,
        ),
        (
            "ListMessageMoveTasks",
            r#"{"Results":[{"ApproximateNumberOfMessagesMoved":2,"ApproximateNumberOfMessagesToMove":10,"DestinationArn":"arn:aws:sqs:us-east-1:1:dest","MaxNumberOfMessagesPerSecond":1,"SourceArn":"arn:aws:sqs:us-east-1:1:dlq","StartedTimestamp":1700000000000,"Status":"RUNNING","TaskHandle":"th"},{"ApproximateNumberOfMessagesMoved":0,"ApproximateNumberOfMessagesToMove":0,"FailureReason":"AWS.SimpleQueueService.NonExistentQueue","SourceArn":"arn:aws:sqs:us-east-1:1:dlq","StartedTimestamp":1700000000001,"Status":"FAILED"}]}"#,
            r#"<?xml version="1.0"?><ListMessageMoveTasksResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><ListMessageMoveTasksResult><ListMessageMoveTasksResultEntry><TaskHandle>th</TaskHandle><Status>RUNNING</Status><SourceArn>arn:aws:sqs:us-east-1:1:dlq</SourceArn><DestinationArn>arn:aws:sqs:us-east-1:1:dest</DestinationArn><MaxNumberOfMessagesPerSecond>1</MaxNumberOfMessagesPerSecond><ApproximateNumberOfMessagesMoved>2</ApproximateNumberOfMessagesMoved><ApproximateNumberOfMessagesToMove>10</ApproximateNumberOfMessagesToMove><StartedTimestamp>1700000000000</StartedTimestamp></ListMessageMoveTasksResultEntry><ListMessageMoveTasksResultEntry><Status>FAILED</Status><SourceArn>arn:aws:sqs:us-east-1:1:dlq</SourceArn><ApproximateNumberOfMessagesMoved>0</ApproximateNumberOfMessagesMoved><ApproximateNumberOfMessagesToMove>0</ApproximateNumberOfMessagesToMove><FailureReason>AWS.SimpleQueueService.NonExistentQueue</FailureReason><StartedTimestamp>1700000000001</StartedTimestamp></ListMessageMoveTasksResultEntry></ListMessageMoveTasksResult><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></ListMessageMoveTasksResponse>"#,
        ),
        (
            "CancelMessageMoveTask",
            r#"{"ApproximateNumberOfMessagesMoved":12345678901234}"#,
            r#"<?xml version="1.0"?><CancelMessageMoveTaskResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><CancelMessageMoveTaskResult><ApproximateNumberOfMessagesMoved>12345678901234</ApproximateNumberOfMessagesMoved></CancelMessageMoveTaskResult><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></CancelMessageMoveTaskResponse>"#,
        ),
        (
            "DeleteMessage",
            r#"{}"#,
            r#"<?xml version="1.0"?><DeleteMessageResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></DeleteMessageResponse>"#,
        ),
        (
            "ListQueueTags",
            r#"{"Tags":{"empty":"","k":"v","team":"a=b&c"}}"#,
            r#"<?xml version="1.0"?><ListQueueTagsResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><ListQueueTagsResult><Tag><Key>empty</Key><Value></Value></Tag><Tag><Key>k</Key><Value>v</Value></Tag><Tag><Key>team</Key><Value>a=b&amp;c</Value></Tag></ListQueueTagsResult><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></ListQueueTagsResponse>"#,
        ),
        (
            "ChangeMessageVisibilityBatch",
            r#"{"Failed":[{"Code":"ReceiptHandleIsInvalid","Id":"c","Message":"The input receipt handle \"x\" is not a valid receipt handle.","SenderFault":true}],"Successful":[{"Id":"a"},{"Id":"b"}]}"#,
            r#"<?xml version="1.0"?><ChangeMessageVisibilityBatchResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/"><ChangeMessageVisibilityBatchResult><ChangeMessageVisibilityBatchResultEntry><Id>a</Id></ChangeMessageVisibilityBatchResultEntry><ChangeMessageVisibilityBatchResultEntry><Id>b</Id></ChangeMessageVisibilityBatchResultEntry><BatchResultErrorEntry><Id>c</Id><SenderFault>true</SenderFault><Code>ReceiptHandleIsInvalid</Code><Message>The input receipt handle &quot;x&quot; is not a valid receipt handle.</Message></BatchResultErrorEntry></ChangeMessageVisibilityBatchResult><ResponseMetadata><RequestId>req-1</RequestId></ResponseMetadata></ChangeMessageVisibilityBatchResponse>"#,
        ),
    ];

    /// `application/x-www-form-urlencoded` decoding, as the HTTP layer does it (`+` is a space: botocore's urlencode
    /// sends spaces that way).
    fn form_pairs(body: &str) -> Vec<(String, String)> {
        fn decode(text: &str) -> String {
            let bytes = text.as_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < bytes.len() {
                match bytes[i] {
                    b'+' => out.push(b' '),
                    b'%' => {
                        let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                        out.push(u8::from_str_radix(hex, 16).unwrap());
                        i += 2;
                    }
                    b => out.push(b),
                }
                i += 1;
            }
            String::from_utf8(out).unwrap()
        }
        body.split('&')
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (decode(k), decode(v))
            })
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn parse(action: &str, list: &[(&str, &str)]) -> Result<Value, QueryError> {
        input_from_form(action, &pairs(list))
    }

    #[test]
    fn every_sqs_action_is_in_the_table() {
        for action in ALL_ACTIONS {
            assert_eq!(
                parse(action, &[("Action", action)]),
                Ok(json!({})),
                "{action}"
            );
        }
        assert_eq!(ACTIONS.len(), ALL_ACTIONS.len());
    }

    #[test]
    fn botocore_query_forms_become_the_json_input_it_was_given() {
        let mut seen = std::collections::BTreeSet::new();
        for (action, body, expected) in FORM_VECTORS {
            let expected: Value = serde_json::from_str(expected).unwrap();
            let got = input_from_form(action, &form_pairs(body));
            assert_eq!(got, Ok(expected), "{action}: {body}");
            seen.insert(*action);
        }
        assert_eq!(seen.len(), ALL_ACTIONS.len());
    }

    #[test]
    fn replies_are_what_botocore_parsed_back_into_the_json_output() {
        for (action, output, xml) in XML_VECTORS {
            let output: Value = serde_json::from_str(output).unwrap();
            assert_eq!(output_to_xml(action, &output, "req-1"), *xml, "{action}");
        }
    }

    #[test]
    fn actions_without_output_reply_with_metadata_only() {
        assert_eq!(
            output_to_xml("PurgeQueue", &json!({}), "r<1>"),
            "<?xml version=\"1.0\"?><PurgeQueueResponse xmlns=\"http://queue.amazonaws.com/doc/2012-11-05/\">\
             <ResponseMetadata><RequestId>r&lt;1&gt;</RequestId></ResponseMetadata></PurgeQueueResponse>"
        );
    }

    #[test]
    fn error_reply_carries_the_legacy_code_botocore_maps_to_exceptions() {
        // botocore 1.34.89 raised QueueDoesNotExist with Error {Type: Sender, Code: …NonExistentQueue, Message: …}.
        assert_eq!(
            error_xml(
                "AWS.SimpleQueueService.NonExistentQueue",
                "The specified queue does not exist for this wsdl version.",
                true,
                "req-err",
            ),
            "<?xml version=\"1.0\"?><ErrorResponse xmlns=\"http://queue.amazonaws.com/doc/2012-11-05/\"><Error>\
             <Type>Sender</Type><Code>AWS.SimpleQueueService.NonExistentQueue</Code>\
             <Message>The specified queue does not exist for this wsdl version.</Message><Detail/></Error>\
             <RequestId>req-err</RequestId></ErrorResponse>"
        );
        let receiver = error_xml("InternalError", "a & \"b\"\r", false, "x");
        assert!(receiver.contains("<Type>Receiver</Type><Code>InternalError</Code>"));
        assert!(receiver.contains("<Message>a &amp; &quot;b&quot;&#xD;</Message>"));
    }

    #[test]
    fn text_is_escaped_so_any_string_survives_an_xml_1_0_parser() {
        let mut xml = String::new();
        push_text(
            &mut xml,
            "a&b<c>d\"e'f\r\n\tg\u{1}\u{b}\u{fffe}\u{ffff}\u{7f}\u{85}\u{2028}😀",
        );
        assert_eq!(
            xml,
            "a&amp;b&lt;c&gt;d&quot;e&apos;f&#xD;\n\tg\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{7f}\u{85}\u{2028}😀"
        );
    }

    #[test]
    fn an_empty_collection_is_sent_as_the_bare_member_name() {
        let url = ("QueueUrl", "u");
        assert_eq!(
            parse("GetQueueAttributes", &[url, ("AttributeNames", "")]),
            Ok(json!({"QueueUrl": "u", "AttributeNames": []}))
        );
        assert_eq!(
            parse("SendMessageBatch", &[url, ("Entries", "")]),
            Ok(json!({"QueueUrl": "u", "Entries": []}))
        );
        assert!(parse("GetQueueAttributes", &[url, ("AttributeName", "All")]).is_err());
    }

    #[test]
    fn receive_message_takes_system_attribute_names_under_either_key() {
        assert_eq!(
            parse(
                "ReceiveMessage",
                &[
                    ("QueueUrl", "u"),
                    ("AttributeName.1", "SentTimestamp"),
                    ("MessageSystemAttributeName.1", "SenderId"),
                    ("MessageAttributeName.1", "All"),
                ]
            ),
            Ok(json!({
                "QueueUrl": "u",
                "AttributeNames": ["SentTimestamp"],
                "MessageSystemAttributeNames": ["SenderId"],
                "MessageAttributeNames": ["All"],
            }))
        );
    }

    #[test]
    fn entries_follow_index_order_not_form_order() {
        assert_eq!(
            parse(
                "DeleteMessageBatch",
                &[
                    ("DeleteMessageBatchRequestEntry.10.Id", "j"),
                    ("DeleteMessageBatchRequestEntry.2.Id", "b"),
                    ("DeleteMessageBatchRequestEntry.2.ReceiptHandle", "rb"),
                    ("DeleteMessageBatchRequestEntry.10.ReceiptHandle", "rj"),
                ]
            ),
            Ok(json!({"Entries": [
                {"Id": "b", "ReceiptHandle": "rb"},
                {"Id": "j", "ReceiptHandle": "rj"},
            ]}))
        );
    }

    #[test]
    fn hostile_indexes_are_refused_before_anything_is_collected() {
        for index in [
            "999999999",
            "1001",
            "0",
            "01",
            "-1",
            "+1",
            "1e3",
            "",
            " 1",
            "99999999999999999999999999",
            "١",
        ] {
            let key = format!("SendMessageBatchRequestEntry.{index}.Id");
            let got = parse("SendMessageBatch", &[(key.as_str(), "a")]);
            assert!(got.is_err(), "{key}: {got:?}");
            let key = format!("SendMessageBatchRequestEntry.1.MessageAttribute.{index}.Name");
            assert!(
                parse("SendMessageBatch", &[(key.as_str(), "a")]).is_err(),
                "{key}"
            );
        }
        assert!(parse(
            "TagQueue",
            &[("Tag.1000.Key", "k"), ("Tag.1000.Value", "v")]
        )
        .is_ok());
        let long = "9".repeat(10_000);
        let err = parse("UntagQueue", &[(format!("TagKey.{long}").as_str(), "k")]).unwrap_err();
        assert!(err.message.len() < 200, "{}", err.message);
    }

    #[test]
    fn a_parameter_given_twice_is_refused() {
        assert!(parse("DeleteQueue", &[("QueueUrl", "a"), ("QueueUrl", "b")]).is_err());
        assert!(parse("UntagQueue", &[("TagKey.1", "a"), ("TagKey.1", "b")]).is_err());
        let same_key = parse(
            "TagQueue",
            &[
                ("Tag.1.Key", "k"),
                ("Tag.1.Value", "1"),
                ("Tag.2.Key", "k"),
                ("Tag.2.Value", "2"),
            ],
        );
        assert!(same_key.is_err());
    }

    #[test]
    fn a_map_entry_needs_its_key_and_its_value() {
        let no_value = parse(
            "SetQueueAttributes",
            &[("Attribute.1.Name", "DelaySeconds")],
        );
        assert!(no_value.unwrap_err().message.contains("Attribute.1.Value"));
        let no_name = parse("SetQueueAttributes", &[("Attribute.1.Value", "5")]);
        assert!(no_name.unwrap_err().message.contains("Attribute.1.Name"));
        let no_attribute_value = parse(
            "SendMessage",
            &[
                ("MessageAttribute.1.Name", "n"),
                ("MessageAttribute.1.Value", ""),
            ],
        );
        assert!(no_attribute_value.is_err());
        // An empty queue attribute or tag value is a value.
        assert_eq!(
            parse("TagQueue", &[("Tag.1.Key", "k"), ("Tag.1.Value", "")]),
            Ok(json!({"Tags": {"k": ""}}))
        );
    }

    #[test]
    fn integers_are_32_bit_decimal() {
        let send = |delay: &str| parse("SendMessage", &[("DelaySeconds", delay)]);
        assert_eq!(send("900"), Ok(json!({"DelaySeconds": 900})));
        assert_eq!(send("-1"), Ok(json!({"DelaySeconds": -1})));
        assert_eq!(send("2147483647"), Ok(json!({"DelaySeconds": 2147483647})));
        for bad in ["2147483648", "1.5", "five", "", " 5", "0x10"] {
            let err = send(bad).unwrap_err();
            assert!(err.message.contains("DelaySeconds"), "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_parameters_are_ignored_and_unknown_actions_refused() {
        assert_eq!(
            parse(
                "DeleteQueue",
                &[
                    ("Action", "DeleteQueue"),
                    ("Version", "2012-11-05"),
                    ("QueueUrl", "u"),
                    ("QueueUrl.1", "x"),
                    ("Bogus", "y"),
                ]
            ),
            Ok(json!({"QueueUrl": "u"}))
        );
        let err = parse("FooBar", &[]).unwrap_err();
        assert_eq!(
            err.message,
            "The action FooBar is not valid for this endpoint."
        );
    }

    /// Deterministic garbage: keys glued from member names, dots, indexes good and bad, and junk, fed to every
    /// action. Nothing may panic, and whatever is accepted must be an object.
    #[test]
    fn garbage_forms_never_panic() {
        const PIECES: [&str; 28] = [
            "SendMessageBatchRequestEntry",
            "MessageAttribute",
            "MessageSystemAttribute",
            "Attribute",
            "AttributeName",
            "AttributeNames",
            "Entries",
            "Tag",
            "TagKey",
            "Name",
            "Value",
            "Key",
            "StringListValue",
            "DataType",
            "Id",
            "DelaySeconds",
            "QueueUrl",
            ".",
            ".1",
            ".2",
            ".1000",
            ".1001",
            ".999999999",
            ".0",
            "..",
            "é",
            "",
            "\u{0}",
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as usize % n
        };
        for round in 0..4000 {
            let action = ALL_ACTIONS[round % ALL_ACTIONS.len()];
            let form: Vec<(String, String)> = (0..next(12))
                .map(|_| {
                    let key: String = (0..1 + next(6))
                        .map(|_| PIECES[next(PIECES.len())])
                        .collect();
                    let value = ["", "1", "x", "true", "-5", "99999999999"][next(6)];
                    (key, value.to_string())
                })
                .collect();
            if let Ok(value) = input_from_form(action, &form) {
                assert!(value.is_object(), "{action} {form:?}");
            }
        }
    }

    #[test]
    fn outputs_of_the_wrong_shape_render_without_panicking() {
        let junk = [
            json!(null),
            json!([1, 2]),
            json!("s"),
            json!({"Messages": "x", "Attributes": [1], "Tags": {"k": {"a": 1}}, "QueueUrls": [null, 3, {"a": 1}]}),
            json!({"Messages": [null, 1, {"Attributes": {"a": null}, "MessageAttributes": {"n": "flat"}}]}),
            json!({"Successful": [{"Id": 5}], "Failed": [{"SenderFault": "yes"}], "queueUrls": [true]}),
        ];
        for action in ALL_ACTIONS.iter().copied().chain(["Nope<&>", ""]) {
            for output in &junk {
                let xml = output_to_xml(action, output, "id");
                assert!(xml.starts_with("<?xml version=\"1.0\"?><"), "{xml}");
                assert!(!xml.contains("Nope<"), "{xml}");
            }
        }
        assert_eq!(
            output_to_xml("Nope<&>", &json!({}), "id"),
            "<?xml version=\"1.0\"?><NopeResponse xmlns=\"http://queue.amazonaws.com/doc/2012-11-05/\">\
             <ResponseMetadata><RequestId>id</RequestId></ResponseMetadata></NopeResponse>"
        );
    }
}
