//! What the driver reads from EC2's answers: instances (with their state, addresses, tags,
//! network interfaces and EBS volumes) and the page token of `DescribeInstances`, read from
//! the response elements by EC2's XML names.

use aws_smithy_types::DateTime;
use aws_smithy_types::date_time::Format;

use crate::xml::Element;

/// A tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: String,
}

/// The state of an instance (`instanceState.name`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum InstanceState {
    /// `pending`
    Pending,
    /// `running`
    Running,
    /// `shutting-down`
    ShuttingDown,
    /// `terminated`
    Terminated,
    /// `stopping`
    Stopping,
    /// `stopped`
    Stopped,
    /// A name this driver does not know, or none.
    #[default]
    Unknown,
}

impl InstanceState {
    /// The state of EC2's name for it.
    pub fn from_name(name: &str) -> InstanceState {
        match name {
            "pending" => InstanceState::Pending,
            "running" => InstanceState::Running,
            "shutting-down" => InstanceState::ShuttingDown,
            "terminated" => InstanceState::Terminated,
            "stopping" => InstanceState::Stopping,
            "stopped" => InstanceState::Stopped,
            _ => InstanceState::Unknown,
        }
    }

    /// Terminated or being terminated.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            InstanceState::ShuttingDown | InstanceState::Terminated
        )
    }
}

/// A network interface of an instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkInterface {
    /// `networkInterfaceId`
    pub id: String,
    /// `status` (`in-use`, `attaching`, ...).
    pub status: String,
    /// `interfaceType` (`interface`, `efa`, `efa-only`, ...).
    pub interface_type: String,
    /// `sourceDestCheck`, when EC2 says.
    pub source_dest_check: Option<bool>,
}

/// An EBS volume attached to an instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Volume {
    /// The device name it is attached as.
    pub device_name: String,
    /// `ebs.volumeId`
    pub volume_id: String,
    /// `ebs.status` (`attached`, `attaching`, ...).
    pub status: String,
}

/// An EC2 instance, as far as the driver reads it. Empty strings are fields EC2 left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Instance {
    /// `instanceId`
    pub id: String,
    /// `instanceState.name`
    pub state: InstanceState,
    /// `stateReason.message`
    pub state_reason: Option<String>,
    /// `privateDnsName`
    pub private_dns_name: String,
    /// `privateIpAddress`
    pub private_ip_address: String,
    /// `ipAddress` (the public IPv4 address)
    pub public_ip_address: String,
    /// `dnsName` (the public DNS name)
    pub public_dns_name: String,
    /// `launchTime`
    pub launch_time: Option<DateTime>,
    /// `tagSet`
    pub tags: Vec<Tag>,
    /// `networkInterfaceSet`
    pub network_interfaces: Vec<NetworkInterface>,
    /// The EBS volumes of `blockDeviceMapping`.
    pub volumes: Vec<Volume>,
}

/// The text of `name` in `e`, empty when absent.
fn text(e: &Element, name: &str) -> String {
    e.text_of(name).unwrap_or_default().trim().to_string()
}

impl Instance {
    /// Reads an instance element (an `<item>` of `instancesSet`).
    pub fn from_xml(e: &Element) -> Instance {
        Instance {
            id: text(e, "instanceId"),
            state: InstanceState::from_name(
                e.at(&["instanceState", "name"])
                    .map(|n| n.text.trim())
                    .unwrap_or_default(),
            ),
            state_reason: e
                .at(&["stateReason", "message"])
                .map(|m| m.text.trim().to_string())
                .filter(|m| !m.is_empty()),
            private_dns_name: text(e, "privateDnsName"),
            private_ip_address: text(e, "privateIpAddress"),
            public_ip_address: text(e, "ipAddress"),
            public_dns_name: text(e, "dnsName"),
            launch_time: e
                .text_of("launchTime")
                .and_then(|t| DateTime::from_str(t.trim(), Format::DateTime).ok()),
            tags: tags_of(e),
            network_interfaces: e
                .items("networkInterfaceSet")
                .map(|n| NetworkInterface {
                    id: text(n, "networkInterfaceId"),
                    status: text(n, "status"),
                    interface_type: text(n, "interfaceType"),
                    source_dest_check: n.text_of("sourceDestCheck").and_then(boolean),
                })
                .collect(),
            volumes: e
                .items("blockDeviceMapping")
                .filter_map(|b| {
                    let ebs = b.child("ebs")?;
                    Some(Volume {
                        device_name: text(b, "deviceName"),
                        volume_id: text(ebs, "volumeId"),
                        status: text(ebs, "status"),
                    })
                })
                .collect(),
        }
    }

    /// The value of the tag `key`.
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|t| t.key == key)
            .map(|t| t.value.as_str())
    }
}

/// The `tagSet` of an element.
pub fn tags_of(e: &Element) -> Vec<Tag> {
    e.items("tagSet")
        .map(|t| Tag {
            key: text(t, "key"),
            value: text(t, "value"),
        })
        .collect()
}

/// XML's booleans.
fn boolean(s: &str) -> Option<bool> {
    match s.trim() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// The instances of a `DescribeInstances` or `RunInstances` response
/// (`reservationSet/item/instancesSet/item`, or `instancesSet/item` at the top).
pub fn instances(response: &Element) -> Vec<Instance> {
    let nested = response
        .items("reservationSet")
        .flat_map(|r| r.items("instancesSet"));
    response
        .items("instancesSet")
        .chain(nested)
        .map(Instance::from_xml)
        .collect()
}

/// The `nextToken` of a page, unless it is the last.
pub fn next_token(response: &Element) -> Option<String> {
    response
        .text_of("nextToken")
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_read_from_describe_and_run_responses() {
        let item = r#"<item><instanceId>i-1</instanceId>
            <instanceState><code>16</code><name>running</name></instanceState>
            <stateReason><code>x</code><message>Client.UserInitiatedShutdown</message></stateReason>
            <privateDnsName>ip-10-0-0-1.ec2.internal</privateDnsName>
            <privateIpAddress>10.0.0.1</privateIpAddress>
            <ipAddress>1.2.3.4</ipAddress><dnsName>ec2-1-2-3-4.compute.amazonaws.com</dnsName>
            <launchTime>2026-11-28T03:04:05.000Z</launchTime>
            <tagSet><item><key>Name</key><value>m-1</value></item></tagSet>
            <networkInterfaceSet><item><networkInterfaceId>eni-1</networkInterfaceId>
                <status>in-use</status><interfaceType>efa</interfaceType>
                <sourceDestCheck>false</sourceDestCheck></item></networkInterfaceSet>
            <blockDeviceMapping><item><deviceName>/dev/xvda</deviceName>
                <ebs><volumeId>vol-1</volumeId><status>attached</status></ebs></item>
                <item><deviceName>/dev/sdc</deviceName></item></blockDeviceMapping>
            </item>"#;
        let describe = format!(
            "<DescribeInstancesResponse><reservationSet><item><instancesSet>{item}</instancesSet></item></reservationSet><nextToken>t-2</nextToken></DescribeInstancesResponse>"
        );
        let doc = crate::xml::parse(&describe).unwrap();
        let got = instances(&doc);
        assert_eq!(got.len(), 1);
        let i = &got[0];
        assert_eq!(i.id, "i-1");
        assert_eq!(i.state, InstanceState::Running);
        assert_eq!(
            i.state_reason.as_deref(),
            Some("Client.UserInitiatedShutdown")
        );
        assert_eq!(i.public_ip_address, "1.2.3.4");
        assert_eq!(i.public_dns_name, "ec2-1-2-3-4.compute.amazonaws.com");
        assert_eq!(
            i.launch_time.map(|t| t.secs()),
            Some(
                DateTime::from_str("2026-11-28T03:04:05Z", Format::DateTime)
                    .unwrap()
                    .secs()
            )
        );
        assert_eq!(i.tag("Name"), Some("m-1"));
        assert_eq!(
            i.network_interfaces,
            vec![NetworkInterface {
                id: "eni-1".into(),
                status: "in-use".into(),
                interface_type: "efa".into(),
                source_dest_check: Some(false),
            }]
        );
        assert_eq!(i.volumes.len(), 1, "a mapping without ebs is no volume");
        assert_eq!(i.volumes[0].volume_id, "vol-1");
        assert_eq!(next_token(&doc).as_deref(), Some("t-2"));

        let run = format!(
            "<RunInstancesResponse><instancesSet>{item}</instancesSet></RunInstancesResponse>"
        );
        let doc = crate::xml::parse(&run).unwrap();
        assert_eq!(instances(&doc)[0].id, "i-1");
        assert_eq!(next_token(&doc), None);
    }

    #[test]
    fn state_names_map_and_unknown_ones_are_unknown() {
        assert!(InstanceState::from_name("shutting-down").is_terminal());
        assert!(InstanceState::from_name("terminated").is_terminal());
        assert!(!InstanceState::from_name("stopped").is_terminal());
        assert_eq!(
            InstanceState::from_name("hibernating"),
            InstanceState::Unknown
        );
    }
}
